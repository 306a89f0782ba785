"""The console's stylesheet and script, inlined in every page (no build step, no CDN, no extra request).

The Content-Security-Policy allows exactly these two by their SHA-256 (`CSP`): no other script or
style runs, inline or fetched, so the pages carry no inline event handlers or style attributes;
buttons name what they do in `data-do` and one listener dispatches.
"""

import base64
import hashlib

CSS = """
body{font:14px system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
nav{background:#24292f;padding:8px 16px}nav a{color:#fff;margin-right:18px;text-decoration:none}
nav .who{float:right;color:#9aa4af}main{padding:16px}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:18px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%}td,th{border:1px solid #d0d7de;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#eaeef2}pre{background:#fff;border:1px solid #d0d7de;padding:8px;overflow:auto;max-height:360px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #d0d7de;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:22px}.charts{display:flex;gap:16px;flex-wrap:wrap}
.chart{background:#fff;border:1px solid #d0d7de;padding:6px}.legend span{margin-right:10px}
.bad{color:#cf222e}.ok{color:#1a7f37}ol.timeline{background:#fff;border:1px solid #d0d7de;padding:8px 8px 8px 32px}
ol.timeline li{margin:4px 0}.ev{font-weight:600}.facts{color:#57606a}
textarea{width:100%;height:260px;font:13px monospace}button{margin:4px 6px 4px 0}
progress{width:320px}#problems li{color:#cf222e}.muted{color:#57606a}
.s-completed{color:#1a7f37}.s-retried{color:#bf8700}.s-poisoned{color:#cf222e}.s-other{color:#0969da}
"""

JS = r"""
const CSRF = document.querySelector('meta[name=csrf]').content;
const BASE = document.querySelector('meta[name=base]').content;
const TICK_S = 0.5, MAX_BATCH = 50;
async function post(action, body) {
  const r = await fetch(BASE + '/action/' + action, {method: 'POST', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', 'X-Console-CSRF': CSRF}, body: JSON.stringify(body)});
  let data = {};
  try { data = await r.json(); } catch (e) { data = {error: 'HTTP ' + r.status}; }
  return {ok: r.ok, status: r.status, data: data};
}
function say(text, bad) { const el = document.getElementById('status'); if (el) { el.textContent = text; el.className = bad ? 'bad' : 'ok'; } }
function checked(table) { return Array.from(document.querySelectorAll('#' + table + ' input.pick:checked')); }
function pickAll(table, on) { document.querySelectorAll('#' + table + ' input.pick').forEach(c => { c.checked = on; }); }
const sleep = ms => new Promise(r => setTimeout(r, ms));
async function replaySelected() {
  const byJob = new Map();
  checked('archived').forEach(c => { if (c.dataset.job && !byJob.has(c.dataset.job)) byJob.set(c.dataset.job, c.dataset.name); });
  const ids = [...byJob.keys()];
  const rate = parseFloat(document.getElementById('rate').value) || 10;
  if (!ids.length) { say('select jobs first', true); return; }
  const size = Math.max(1, Math.min(MAX_BATCH, Math.floor(rate * TICK_S)));
  const bar = document.getElementById('progress'); bar.max = ids.length; bar.value = 0;
  let done = 0, replayed = 0;
  for (let i = 0; i < ids.length; i += size) {
    const started = performance.now();
    const batch = ids.slice(i, i + size);
    const r = await post('replay', {ids: batch, names: batch.map(j => byJob.get(j)), rate: rate});
    if (!r.ok) { say('replay stopped: ' + (r.data.error || r.status), true); return; }
    done += batch.length; replayed += (r.data.replayed || []).length; bar.value = done;
    document.getElementById('progress-text').textContent = done + ' / ' + ids.length;
    const wait = batch.length / rate * 1000 - (performance.now() - started);
    if (wait > 0) await sleep(wait);
  }
  say('replayed ' + replayed + ' of ' + ids.length);
}
async function entriesAction(action, table, confirmText) {
  const names = checked(table).map(c => c.dataset.name);
  if (!names.length) { say('select entries first', true); return; }
  if (confirmText && !window.confirm(confirmText.replace('{n}', names.length))) return;
  const r = await post(action, {names: names});
  if (!r.ok) { say(action + ' failed: ' + (r.data.error || r.status), true); return; }
  location.reload();
}
async function purge() {
  const days = parseFloat(document.getElementById('days').value);
  if (!(days >= 0)) { say('days: a number >= 0', true); return; }
  if (!window.confirm('Delete archive entries older than ' + days + ' days?')) return;
  const r = await post('purge', {older_than_days: days});
  if (!r.ok) { say('purge failed: ' + (r.data.error || r.status), true); return; }
  if (r.data.op) { location.href = BASE + '/ops/' + r.data.op; return; }
  location.reload();
}
async function startOp(el) {
  if (el.dataset.confirm && !window.confirm(el.dataset.confirm)) return;
  const rate = parseFloat((document.getElementById('rate') || {}).value) || 10;
  const body = {kind: el.dataset.op, state: el.dataset.state, rate: rate, dry_run: el.dataset.dry === '1'};
  if (el.dataset.code || el.dataset.text || el.dataset.queue) body.where = {reason_code: el.dataset.code || '', text: el.dataset.text || '', queue: el.dataset.queue || ''};
  const r = await post('op-start', body);
  if (!r.ok) { say(el.dataset.op + ' failed: ' + (r.data.error || r.status), true); return; }
  location.href = BASE + '/ops/' + r.data.op;
}
async function opChange(el) {
  const r = await post('op-' + el.dataset.op, {op: el.dataset.id});
  if (!r.ok) { say(el.dataset.op + ' failed: ' + (r.data.error || r.status), true); return; }
  location.reload();
}
function showProblems(list) {
  const ul = document.getElementById('problems'); ul.innerHTML = '';
  (list || []).forEach(p => { const li = document.createElement('li'); li.textContent = p;
    li.dataset.field = p.split(':')[0]; ul.appendChild(li); });
}
async function editAction(action) {
  const jobId = document.getElementById('envelope').dataset.job;
  const r = await post(action, {job_id: jobId, envelope: document.getElementById('envelope').value});
  showProblems(r.data.problems);
  if (!r.ok) { say(r.data.error || ('HTTP ' + r.status), true); return; }
  if (action === 'validate') { say(r.data.problems.length ? 'invalid' : 'valid', r.data.problems.length > 0); return; }
  say('replayed with changes: ' + r.data.changes.join(', '));
  setTimeout(() => location.reload(), 800);
}
function extendExpiry() {
  const box = document.getElementById('envelope');
  let env;
  try { env = JSON.parse(box.value); } catch (e) { say('the envelope is not JSON', true); return; }
  env.expires_at = new Date(Date.now() + 86400000).toISOString().replace('.000Z', 'Z');
  box.value = JSON.stringify(env, null, 2);
  say('expires_at set to ' + env.expires_at + ': validate, then replay edited');
}
async function fixAction() {
  const box = document.getElementById('fixed');
  const r = await post('replay-fixed', {name: box.dataset.entry, envelope: box.value});
  showProblems(r.data.problems);
  if (!r.ok) { say(r.data.error || ('HTTP ' + r.status), true); return; }
  say('replayed as job ' + r.data.id);
  setTimeout(() => location.reload(), 800);
}
async function refreshOverview() {
  const box = document.getElementById('overview');
  if (!box) return;
  try {
    const r = await fetch(BASE + '/fragment/overview' + location.search, {credentials: 'same-origin'});
    if (r.ok) { box.innerHTML = await r.text(); box.dataset.refreshed = String(Date.now()); }
  } catch (e) { /* the next refresh tries again */ }
}
if (document.getElementById('overview')) setInterval(refreshOverview, 5000);
const OP = document.getElementById('op');
if (OP && OP.dataset.running === '1') setTimeout(() => location.reload(), 2000);
const LIVE = document.getElementById('live');
if (LIVE && LIVE.dataset.running === '1') setTimeout(() => location.reload(), 3000);
async function cancelJob(el) {
  if (!window.confirm(el.dataset.confirm)) return;
  const r = await post('cancel', {job_id: el.dataset.job});
  if (!r.ok) { say('cancel failed: ' + (r.data.error || r.status), true); return; }
  say(r.data.said);
}
const DOES = {
  'replay-selected': () => replaySelected(),
  'entries': el => entriesAction(el.dataset.op, el.dataset.table, el.dataset.confirm),
  'purge': () => purge(),
  'edit': el => editAction(el.dataset.op),
  'pick-all': el => pickAll(el.dataset.table, el.checked),
  'fix': () => fixAction(),
  'op': el => startOp(el),
  'op-change': el => opChange(el),
  'cancel-job': el => cancelJob(el),
  'extend-expiry': () => extendExpiry(),
};
document.addEventListener('click', e => {
  const el = e.target.closest('[data-do]');
  if (el && DOES[el.dataset.do]) DOES[el.dataset.do](el);
});
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CSP = (
    f"default-src 'none'; script-src {_sha256(JS)}; style-src {_sha256(CSS)}; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The policy of every console response: the inlined script and stylesheet and nothing else run;
fetches (changes, the overview's refresh) and forms go to the app only; never framed."""
