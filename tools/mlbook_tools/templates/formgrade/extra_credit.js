// An extra-credit cell is worth 0 points in nbgrader (its points are extra credit, so a full-marks
// student reads 13 / 10, not 13 / 19). On such a cell "Full credit" (data-extra-max) gives 0 points
// and the cell's maximum as extra credit, in one save: formgrader's own handler, which would save
// its 0 alone first and race this one, is not reached (capture phase).
document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest(".full-credit[data-extra-max]") : null;
    if (!button) { return; }
    event.stopPropagation();
    var grade = button.closest(".panel-heading");
    var score = grade.querySelector("input.score");
    var extra = grade.querySelector("input.extra-credit");
    score.value = "0";
    extra.value = button.getAttribute("data-extra-max");
    window.jQuery(extra).trigger("change");
    score.focus();
}, true);
