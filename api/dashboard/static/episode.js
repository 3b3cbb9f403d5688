// The episode page: per-turn token view (loss mask + per-token logprobs), token detail, deep links
// of the form #turn-3 and #turn-3-token-17.
"use strict";
(() => {
  const root = document.querySelector(".episode-layout");
  if (!root) return;
  const episodeId = root.dataset.episode;
  const detail = document.getElementById("token-detail");
  const loaded = {};

  function probabilityColor(logprob) {
    const p = Math.exp(logprob);  // 0 → red, 1 → green
    return `hsl(${Math.round(120 * p)}, 75%, 84%)`;
  }

  function showToken(turn, j) {
    const data = loaded[turn];
    document.querySelectorAll(".tok.selected").forEach(el => el.classList.remove("selected"));
    const span = document.querySelector(`#tokens-${turn} .tok[data-j="${j}"]`);
    if (!span || !data) return;
    span.classList.add("selected");
    const lp = data.logprobs[j];
    const sampled = data.loss_mask[j] === 1;
    const lines = [
      `turn ${turn} · token ${j}`, `id ${data.token_ids[j]}`,
      `text ${data.pieces ? JSON.stringify(data.pieces[j]) : "(no tokenizer)"}`,
      `mask ${data.loss_mask[j]} (${sampled ? "sampled by the policy: trained on" : "environment: not trained on"})`,
      sampled ? `logprob ${lp.toFixed(4)} · p ${Math.exp(lp).toFixed(4)}` : "logprob – (not sampled)",
    ];
    detail.textContent = lines.join("\n");
    detail.style.whiteSpace = "pre";
    detail.hidden = false;
    history.replaceState(null, "", `#turn-${turn}-token-${j}`);
  }

  function render(turn, data) {
    const view = document.getElementById(`tokens-${turn}`);
    view.textContent = "";
    const sampled = data.loss_mask.filter(m => m === 1).length;
    const legend = document.createElement("div");
    legend.className = "token-legend";
    legend.textContent = `${data.token_ids.length} tokens: ${data.token_ids.length - sampled} environment (grey, mask 0), ` +
      `${sampled} sampled (mask 1, coloured by probability: red low → green high)` + (data.pieces ? "" : " · ids shown: the run's model has no tokenizer");
    const tokens = document.createElement("div");
    tokens.className = "tokens";
    data.token_ids.forEach((id, j) => {
      const span = document.createElement("span");
      span.className = "tok m" + data.loss_mask[j];
      span.dataset.j = j;
      span.textContent = data.pieces ? data.pieces[j] : `${id} `;
      if (data.loss_mask[j] === 1) span.style.background = probabilityColor(data.logprobs[j]);
      span.title = `#${j} id ${id} logprob ${data.logprobs[j].toFixed(3)}`;
      tokens.appendChild(span);
    });
    tokens.addEventListener("click", event => {
      const target = event.target.closest(".tok");
      if (target) showToken(turn, Number(target.dataset.j));
    });
    view.append(legend, tokens);
  }

  async function openTokens(turn) {
    const view = document.getElementById(`tokens-${turn}`);
    if (!view) return;
    if (!loaded[turn]) {
      view.hidden = false;
      view.textContent = "loading tokens…";
      const response = await fetch(`/v1/episodes/${episodeId}/turns/${turn}/tokens`, { credentials: "same-origin" });
      if (!response.ok) {
        view.textContent = `could not load tokens (${response.status})`;
        return;
      }
      loaded[turn] = await response.json();
      render(turn, loaded[turn]);
    }
    view.hidden = false;
  }

  document.querySelectorAll(".tokens-button").forEach(button => {
    button.addEventListener("click", async () => {
      const turn = button.dataset.index;
      const view = document.getElementById(`tokens-${turn}`);
      if (loaded[turn] && !view.hidden) { view.hidden = true; return; }
      await openTokens(turn);
    });
  });

  const deep = location.hash.match(/^#turn-(\d+)-token-(\d+)$/);
  if (deep) {
    openTokens(deep[1]).then(() => {
      showToken(deep[1], Number(deep[2]));
      document.getElementById(`turn-${deep[1]}`).scrollIntoView();
    });
  }
})();
