{#- nbgrader's formgrader pages (its base.tpl, found as nbgrader/base.tpl: formgrader_guard.extend_templates),
    plus one script of mlbook's: what `mlbook grade-class` knows about each submission (flags.py). -#}
{%- extends 'nbgrader/base.tpl' -%}
{%- block script -%}
{{ super() }}
{%- set mlbook_js -%}{% include 'mlbook_formgrader.js' %}{%- endset %}
<script type="text/javascript">{{ mlbook_js }}</script>
{%- endblock -%}
