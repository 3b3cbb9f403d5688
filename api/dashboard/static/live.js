// Small page helpers: filter forms drop empty fields; a running group's page refreshes itself.
"use strict";
(() => {
  const form = document.getElementById("episode-filters");
  if (form) {
    form.addEventListener("submit", () => {
      for (const field of form.querySelectorAll("input, select")) if (!field.value) field.disabled = true;
    });
  }
  if (document.querySelector("#group-status .s-running")) setTimeout(() => location.reload(), 5000);
})();
