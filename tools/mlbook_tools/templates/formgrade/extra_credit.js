// An extra-credit cell is worth 0 points in nbgrader (its points are extra credit, so a full-marks
// student reads 13 / 10, not 13 / 19). formgrader's "Full credit" sets the score to that 0; here it
// also fills the extra-credit box with the cell's maximum (data-extra-max), which nbgrader saves.
document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest(".full-credit[data-extra-max]") : null;
    if (!button) { return; }
    var grade = button.closest(".panel-heading");
    var score = grade.querySelector("input.score");
    var extra = grade.querySelector("input.extra-credit");
    score.value = "0";
    extra.value = button.getAttribute("data-extra-max");
    window.setTimeout(function () { window.jQuery(extra).trigger("change"); }, 0);
});
