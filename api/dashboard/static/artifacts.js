// The episode page's text artifacts (the opening observation, notes on what was not stored): fetched
// from the artifact route when their <details> opens, and shown as text, never as HTML.
"use strict";
(() => {
  async function load(details) {
    if (details.dataset.loaded) return;
    details.dataset.loaded = "1";
    const body = details.querySelector(".artifact-body");
    try {
      const response = await fetch(details.dataset.src, { credentials: "same-origin" });
      body.textContent = response.ok ? await response.text() : `could not load the artifact (${response.status})`;
    } catch (error) {
      body.textContent = `could not load the artifact (${error})`;
      delete details.dataset.loaded;  // opening it again retries
    }
  }

  document.querySelectorAll("details.artifact-text").forEach(details => {
    if (details.open) load(details);
    details.addEventListener("toggle", () => { if (details.open) load(details); });
  });
})();
