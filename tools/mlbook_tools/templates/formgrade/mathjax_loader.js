    window.MathJax = {
        TeX: {equationNumbers: {autoNumber: "AMS", useLabelIds: true}},
        tex2jax: {inlineMath: [['$', '$'], ["\\(", "\\)"]], displayMath: [['$$', '$$'], ["\\[", "\\]"]],
                  processEscapes: true, processEnvironments: true},
        displayAlign: 'center', messageStyle: 'none',
        // a student's TeX carries no address, style, class or id into the page: \href, \style
        // (\style{cursor:url(...)} fetches on hover), \class, \cssId, \bbox's style and \require
        // typeset their content only (mlbook_tools/templates/formgrade/mathjax.html.j2)
        Safe: {allow: {URLs: "none", classes: "none", cssIDs: "none", styles: "none", require: "none"}},
        // the shipped copy has the STIX-Web fonts only (as Jupyter's classic notebook configures it)
        "HTML-CSS": {availableFonts: [], imageFont: null, preferredFont: null, font: "STIX-Web",
                     webFont: "STIX-Web"}
    };
    (function () {
        var config = "?config=TeX-AMS-MML_HTMLorMML-full,Safe";
        var urls = ["../../../mathjax/MathJax.js" + config,
                    "/static/jupyter_server_mathjax/MathJax.js" + config,
                    "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/MathJax.js" + config];
        function load(i) {
            if (i >= urls.length) return;
            var s = document.createElement("script");
            s.src = urls[i];
            s.onerror = function () { s.remove(); load(i + 1); };
            document.head.appendChild(s);
        }
        load(0);
    })();
