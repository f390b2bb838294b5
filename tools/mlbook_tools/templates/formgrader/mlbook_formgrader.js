// formgrader's lists, as `mlbook grade-class` knows them (mlbook_tools/flags.py, formgrader_guard.py):
// a misnamed, refused or unreadable submission shows its kind and one-line reason (never "needs
// autograding" or "needs manual grading"), and the Autograde button answers that reason; a student
// without names shows the id alone (never "alice," or "None, None"); a written score whose answers
// are extra credit shows the extra credit they may earn.
(function () {
    var flagged = function (view) {
        var flag = view.model.get("mlbook_flag");
        if (!flag) { return; }
        var cell = view.$status && view.$status.length ? view.$status : view.$needs_manual_grade;
        if (!cell || !cell.length) { return; }
        cell.empty().attr("data-order", -1).attr("data-search", flag.kind);
        cell.append($("<span/>").addClass("label label-danger mlbook-flag-kind").text(flag.kind));
        cell.append($("<div/>").addClass("mlbook-flag text-left small").css("white-space", "normal")
            .text(flag.reason + ". " + flag.todo));
    };
    var named = function (view) {
        var first = view.model.get("first_name"), last = view.model.get("last_name");
        var id = view.model.get("student") || view.model.get("id");
        var blank = function (x) { return x === null || x === undefined || x === "" || x === "None"; };
        var name = null;
        if (blank(first) && (blank(last) || last === id)) { name = id; }
        else if (blank(first)) { name = last; }
        else if (blank(last)) { name = first; }
        var el = view.$student_name && view.$student_name.length ? view.$student_name : view.$name;
        if (name === null || !el || !el.length) { return; }
        var link = el.find("a.name-shown");
        if (!link.length) { link = el.find("a"); }
        (link.length ? link : el).text(name);
        if (!el.find("a.name-hidden").length) { el.attr("data-order", name); }
    };
    var written = function (view) {
        var extra = view.model.get("mlbook_written_extra_max");
        if (!extra || !view.$written_score || !view.$written_score.length) { return; }
        var score = roundToPrecision(view.model.get("written_score"), 2);
        var max = roundToPrecision(view.model.get("max_written_score"), 2);
        view.$written_score.text(max === 0 ? score + " / " + extra + " extra credit"
            : score + " / " + max + " (+ up to " + extra + " extra credit)");
    };
    var patch = function (name) {
        var View = window[name];
        if (!View || !View.prototype || !View.prototype.render) { return; }
        var render = View.prototype.render;
        View.prototype.render = function () {
            var out = render.apply(this, arguments);
            named(this);
            flagged(this);
            written(this);
            return out;
        };
        if (View.prototype.autograde_success) {
            var done = View.prototype.autograde_success;
            View.prototype.autograde_success = function (response) {
                var reply = typeof response === "string" ? JSON.parse(response) : response;
                if (reply && reply.mlbook_flag) {
                    this.model.fetch();
                    createModal("error-modal", "Not autograded", reply.mlbook_flag.line);
                    return;
                }
                return done.call(this, response);
            };
        }
    };
    ["SubmissionUI", "SubmittedNotebookUI", "StudentUI", "StudentSubmissionUI"].forEach(patch);
})();
