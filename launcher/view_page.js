// pqrl view: the page's script (served inline by launcher/view_page.py; no outside assets).
const $ = (tag, props = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'text') e.textContent = v; else if (k === 'on') for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
};
const SVG = 'http://www.w3.org/2000/svg';
const s$ = (tag, attrs) => { const e = document.createElementNS(SVG, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
const fmt = v => v == null ? '' : (typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toFixed(3)) : String(v));
const api = async path => { const r = await fetch(path); const j = await r.json(); if (!r.ok) throw new Error(j.error); return j; };
const main = () => document.querySelector('main');

function plot(title, points, kind = 'line') {
  const W = 320, H = 150, P = 30, box = $('div', {class: 'plot'}, $('h3', {text: title}));
  const svg = s$('svg', {width: W, height: H, 'data-title': title});
  if (!points.length) { box.append($('div', {text: 'no data yet'})); return box; }
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = x => P + (x1 === x0 ? (W - 2 * P) / 2 : (x - x0) / (x1 - x0) * (W - 2 * P));
  const Y = y => H - P + 10 - (y - y0) / (y1 - y0) * (H - P - 20);
  svg.append(s$('line', {x1: P, y1: Y(y0), x2: W - P, y2: Y(y0), stroke: '#999'}));
  svg.append(s$('line', {x1: P, y1: Y(y0), x2: P, y2: 10, stroke: '#999'}));
  for (const [y, a] of [[y0, 'end'], [y1, 'end']]) { const t = s$('text', {x: P - 3, y: Y(y) + 4, 'font-size': 10, 'text-anchor': a}); t.textContent = fmt(y); svg.append(t); }
  if (kind === 'bar') {
    const w = (W - 2 * P) / points.length;
    points.forEach(([x, y], i) => {
      const r = s$('rect', {x: P + i * w + 2, y: Y(y), width: Math.max(w - 4, 1), height: Y(y0) - Y(y), fill: '#4a8bd6', class: 'bar'});
      const t = s$('title', {}); t.textContent = `${x}: ${y}`; r.append(t); svg.append(r);
      const l = s$('text', {x: P + i * w + w / 2, y: H - 4, 'font-size': 10, 'text-anchor': 'middle'}); l.textContent = x; svg.append(l);
    });
  } else {
    svg.append(s$('polyline', {points: points.map(([x, y]) => `${X(x)},${Y(y)}`).join(' '), fill: 'none', stroke: '#2a6fc0', 'stroke-width': 2}));
    for (const [x, y] of points) { const c = s$('circle', {cx: X(x), cy: Y(y), r: 2.5, fill: '#2a6fc0'}); const t = s$('title', {}); t.textContent = `step ${x}: ${fmt(y)}`; c.append(t); svg.append(c); }
    const l = s$('text', {x: W - P, y: H - 4, 'font-size': 10, 'text-anchor': 'end'}); l.textContent = `step ${x0}..${x1}`; svg.append(l);
  }
  box.append(svg); return box;
}

async function viewRun() {
  const r = await api('/api/run');
  document.title = `pqrl view: ${r.run}`;
  const series = (k, f) => r.metrics[k] && r.metrics[k].length ? r.metrics[k] : r.steps.filter(s => s[f] != null).map(s => [s.step, s[f]]);
  const plots = $('div', {class: 'plots', id: 'plots'},
    plot('reward per step', series('rollout/reward_mean', 'reward_mean')),
    plot('pass rate per step', series('rollout/pass_rate', 'pass_rate')),
    plot('staleness (versions behind), trajectories', Object.entries(r.staleness), 'bar'),
    plot('mismatch KL (engine vs trainer)', r.metrics['offpolicy/mismatch_kl'] || []),
    plot('tool error rate', series('rollout/tool_error_rate', 'tool_error_rate')),
    plot('dropped, by reason', Object.entries(r.dropped), 'bar'));
  const rows = r.steps.map(s => $('tr', {class: 'step-row'},
    $('td', {}, $('a', {href: `#/step/${s.step}`, text: String(s.step)})), $('td', {text: s.trajectories}),
    $('td', {text: s.trained}), $('td', {class: 'l', text: Object.entries(s.dropped).map(([k, v]) => `${k} ${v}`).join(', ')}),
    $('td', {text: fmt(s.reward_mean)}), $('td', {text: fmt(s.pass_rate)})));
  main().replaceChildren($('h2', {text: `run ${r.run}: ${r.steps.length} steps logged`}), plots,
    $('h2', {text: 'steps'}), $('table', {id: 'steps'}, $('tr', {}, ...['step', 'trajectories', 'trained', 'dropped', 'reward', 'pass rate'].map(h => $('th', {text: h}))), ...rows));
}

const COLS = [['id', 'episode'], ['group_id', 'group'], ['task_id', 'task'], ['env', 'env'], ['status', 'status'], ['reward', 'reward'],
  ['advantage', 'advantage'], ['drop_reason', 'dropped'], ['staleness', 'staleness'], ['truncated', 'truncated'], ['num_tokens', 'tokens'], ['tool_errors', 'tool errors']];
let sortKey = 'reward', sortDir = -1;

async function viewStep(step) {
  const eps = await api(`/api/step?step=${step}`);
  const f = {status: $('select', {id: 'f-status'}, ...['all', 'trained', 'dropped', 'failed_infra', 'failed_env', 'truncated', 'tool_error'].map(o => $('option', {value: o, text: o}))),
    env: $('input', {id: 'f-env', placeholder: 'env'}), task: $('input', {id: 'f-task', placeholder: 'task'}),
    rmin: $('input', {id: 'f-rmin', placeholder: 'reward >=', type: 'number', step: 'any'}), rmax: $('input', {id: 'f-rmax', placeholder: 'reward <=', type: 'number', step: 'any'}),
    amin: $('input', {id: 'f-amin', placeholder: 'advantage >=', type: 'number', step: 'any'}), amax: $('input', {id: 'f-amax', placeholder: 'advantage <=', type: 'number', step: 'any'})};
  const table = $('table', {id: 'episodes'});
  const keep = e => {
    const s = f.status.value;
    if (s === 'trained' && !e.used || s === 'dropped' && e.used || s === 'truncated' && !e.truncated || s === 'tool_error' && !e.tool_errors) return false;
    if ((s === 'failed_infra' || s === 'failed_env') && e.status !== s) return false;
    if (f.env.value && !e.env.includes(f.env.value) || f.task.value && !e.task_id.includes(f.task.value)) return false;
    if (f.rmin.value !== '' && e.reward < +f.rmin.value || f.rmax.value !== '' && e.reward > +f.rmax.value) return false;
    // a dropped trajectory has no advantage: an advantage bound leaves it out
    if (f.amin.value !== '' && !(e.advantage >= +f.amin.value) || f.amax.value !== '' && !(e.advantage <= +f.amax.value)) return false;
    return true;
  };
  const draw = () => {
    const shown = eps.filter(keep).sort((a, b) => { const x = a[sortKey], y = b[sortKey]; return (x == null) - (y == null) || (x < y ? -1 : x > y ? 1 : 0) * sortDir; });
    const head = $('tr', {}, ...COLS.map(([k, h]) => $('th', {text: h + (k === sortKey ? (sortDir > 0 ? ' ▲' : ' ▼') : ''), 'data-key': k,
      on: {click: () => { sortDir = k === sortKey ? -sortDir : 1; sortKey = k; draw(); }}})));
    table.replaceChildren(head, ...shown.map(e => $('tr', {class: 'ep' + (e.used ? '' : ' dropped'), 'data-id': e.id}, ...COLS.map(([k]) =>
      k === 'id' ? $('td', {class: 'l'}, $('a', {href: `#/episode/${step}/${encodeURIComponent(e.id)}`, text: e.id}))
      : k === 'group_id' ? $('td', {class: 'l'}, $('a', {href: `#/group/${step}/${encodeURIComponent(e.group_id)}`, text: e.group_id}))
      : $('td', {class: typeof e[k] === 'string' ? 'l' : '', text: fmt(e[k])})))));
    document.getElementById('shown').textContent = `${shown.length} of ${eps.length} trajectories`;
  };
  for (const el of Object.values(f)) { el.addEventListener('input', draw); el.addEventListener('change', draw); }
  main().replaceChildren($('h2', {text: `step ${step}`}), $('div', {class: 'filters'}, ...Object.values(f), $('span', {id: 'shown'})), table);
  draw();
}

function tokenView(e, hover) {
  const box = $('div', {class: 'tokens'});
  e.tokens.forEach((id, i) => {
    const gen = e.generated[i] === 1, trained = e.loss_mask[i] === 1;
    const cls = !gen ? 'context' : trained ? 'trained' : 'masked';
    const tip = `token ${i}  id ${id}\n${gen ? `behaviour logprob ${fmt(e.behavior_logprobs[i])}\ntrainer logprob ${e.trainer_logprobs ? fmt(e.trainer_logprobs[i]) || '-' : '-'}\nversion ${e.versions[i]}\n` : 'not generated (prompt or tool output)\n'}${trained ? 'trained' : 'not trained'}  advantage ${e.token_advantages ? fmt(e.token_advantages[i]) : fmt(e.advantage) || '-'}`;
    box.append($('span', {class: `tok ${cls}`, 'data-i': i, title: tip, on: {mouseover: () => { hover.textContent = tip; }}}, e.texts ? e.texts[i] : `⟨${id}⟩`));
  });
  return box;
}

function toolCalls(e) {
  const text = (a, b) => e.texts ? e.texts.slice(a, b).join('') : e.tokens.slice(a, b).join(' ');
  const out = [];
  (e.turns || []).forEach((t, n) => {
    const next = n + 1 < e.turns.length ? e.turns[n + 1].start : e.tokens.length;
    for (const c of t.tool_calls) out.push($('div', {class: `tool-call status-${c.status}`},
      $('b', {text: `turn ${n + 1}: ${c.name}`}), $('span', {class: 'call-status', text: `  status: ${c.status}`}),
      $('pre', {class: 'call-args', text: JSON.stringify(c.arguments)}), c.error ? $('div', {class: 'err', text: c.error}) : null,
      $('pre', {class: 'tool-output', text: text(t.end, next)})));
  });
  return out.length ? out : [$('div', {text: 'no tool calls'})];
}

function facts(e) {
  return $('table', {class: 'facts'}, ...[['episode', e.id], ['task', e.task_id], ['env', e.env], ['status', e.status], ['reward', e.reward],
    ['advantage', e.advantage], ['dropped', e.drop_reason || 'no: trained'], ['staleness', e.staleness], ['policy version', e.policy_version],
    ['tokens', `${e.num_tokens} (${e.num_generated} generated)`], ['truncation', e.truncation ? JSON.stringify(e.truncation) : 'none']]
    .map(([k, v]) => $('tr', {}, $('th', {class: 'l', text: k}), $('td', {class: 'l', text: fmt(v)}))));
}

const legend = () => $('div', {class: 'legend'}, $('span', {class: 'tok trained', text: 'trained (loss mask 1)'}),
  $('span', {class: 'tok masked', text: 'generated, not trained'}), $('span', {class: 'tok context', text: 'prompt / tool output'}));

async function viewEpisode(step, id) {
  const e = await api(`/api/episode?step=${step}&id=${encodeURIComponent(id)}`);
  const hover = $('div', {id: 'hover', text: 'hover a token'});
  main().replaceChildren($('h2', {}, $('a', {href: `#/step/${step}`, text: `step ${step}`}), ` / episode ${e.id} (`,
      $('a', {href: `#/group/${step}/${encodeURIComponent(e.group_id)}`, text: `group ${e.group_id}`}), ')'),
    $('div', {class: 'episode'},
      $('div', {}, facts(e), $('h2', {text: 'reward_info'}), $('pre', {id: 'reward-info', text: JSON.stringify(e.reward_info, null, 2)}),
        $('h2', {text: 'tool calls'}), $('div', {id: 'tool-calls'}, ...toolCalls(e))),
      $('div', {}, $('h2', {text: 'the conversation as the model saw it'}), legend(), tokenView(e, hover))), hover);
}

async function viewGroup(step, gid) {
  const eps = await api(`/api/group?step=${step}&group=${encodeURIComponent(gid)}`);
  const hover = $('div', {id: 'hover', text: 'hover a token'});
  const side = $('div', {class: 'side'});
  side.style.gridTemplateColumns = `repeat(${eps.length},minmax(0,1fr))`;  // CSSOM: allowed by the CSP
  for (const e of eps) side.append($('div', {class: 'member', 'data-id': e.id},
    $('h3', {}, $('a', {href: `#/episode/${step}/${encodeURIComponent(e.id)}`, text: e.id})),
    $('div', {text: `reward ${fmt(e.reward)}  advantage ${fmt(e.advantage) || '-'}  ${e.drop_reason ? 'dropped: ' + e.drop_reason : 'trained'}`}),
    $('pre', {class: 'reward-info', text: JSON.stringify(e.reward_info)}), tokenView(e, hover)));
  main().replaceChildren($('h2', {}, $('a', {href: `#/step/${step}`, text: `step ${step}`}), ` / group ${gid}: ${eps.length} episodes`), legend(), side, hover);
}

async function route() {
  const [, view, a, b] = location.hash.split('/');
  try {
    if (view === 'step') await viewStep(+a);
    else if (view === 'episode') await viewEpisode(+a, decodeURIComponent(b));
    else if (view === 'group') await viewGroup(+a, decodeURIComponent(b));
    else await viewRun();
  } catch (err) { main().replaceChildren($('div', {class: 'err', id: 'error', text: String(err.message || err)})); }
  document.body.setAttribute('data-view', view || 'run');
}
window.addEventListener('hashchange', route);
route();
