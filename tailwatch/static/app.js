// The console: each view fetches the JSON API and draws it. The URL fragment holds the view, the range and the
// view's selections (#/tokens?range=6h&group=...), so a link opens exactly what its sender saw.
import { barChart, fitText, fmt, heatmap, lanes, shareTimeline, timeChart, utc, waterfall } from './charts.js';

const RANGES = { '15m': 9e5, '1h': 36e5, '6h': 216e5, '24h': 864e5, '7d': 6048e5 };
const DAY = 864e5;
const view = document.getElementById('view');
let timer = null;
let generation = 0;

// ---- the URL is the state ----------------------------------------------------------------------

function state() {
  const [path, query] = location.hash.replace(/^#\/?/, '').split('?');
  const params = new URLSearchParams(query || '');
  return { view: path || 'overview', params };
}

function go(viewName, changes = {}, { keep = true } = {}) {
  const { view: current, params } = state();
  const next = new URLSearchParams();
  for (const k of ['range', 'from', 'to', 'refresh']) if (params.has(k)) next.set(k, params.get(k));
  if (keep && viewName === current) for (const [k, v] of params) if (!next.has(k)) next.set(k, v);
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === undefined || v === '') next.delete(k); else next.set(k, v);
  }
  location.hash = `#/${viewName}?${next}`;
}

function range(params) {
  if (params.get('range') === 'custom' || (params.has('from') && !params.has('range'))) {
    const from = Date.parse(params.get('from') + 'Z'), to = Date.parse(params.get('to') + 'Z');
    if (Number.isFinite(from) && Number.isFinite(to) && from < to) return { from, to, label: 'custom' };
  }
  const key = RANGES[params.get('range')] ? params.get('range') : '24h';
  const to = Date.now();
  return { from: to - RANGES[key], to, label: key };
}

const iso = (t) => new Date(t).toISOString().replace('.000', '');

// ---- fetching ----------------------------------------------------------------------------------

async function api(path) {
  const response = await fetch(path, { headers: { Accept: 'application/json' } });
  if (response.status === 401) {
    location.replace('/login' + location.hash);
    throw new Error('signed out');
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : response.statusText);
  return body;
}

// What this render's figures left out: past its limit the server keeps every stride-th window counting back
// from the newest (so a long range is drawn whole, at a coarser grain) and cuts the oldest rows beyond that.
// The page says so above its charts rather than ending a range early without a word.
let capped = [];

// A detector's figures over a range; `query` narrows them on the server (columns, distinct, column=value).
async function figures(detector, from, to, query = {}) {
  const body = await api(`/v1/figures/${detector}?${new URLSearchParams({ from: iso(from), to: iso(to), ...query })}`);
  if (body.truncated) capped.push({ detector, stride: body.stride, rows: body.rows.length });
  return body;
}

function cappedNote(notes) {
  if (!notes.length) return null;
  const said = new Map();
  for (const n of notes) {
    said.set(n.detector, n.stride > 1
      ? `${n.detector}: one window in ${n.stride}`
      : `${n.detector}: the newest ${n.rows} rows`);
  }
  return h('p', { class: 'notice', role: 'status', id: 'capped' },
    `This range holds more figures than a chart draws, so it is shown at a coarser grain (newest window included): ${[...said.values()].join('; ')}. Narrow the range for every window.`);
}

// ---- small DOM helpers -------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v; else if (k.startsWith('on')) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

function table(columns, rows, { id = null, empty = 'nothing here' } = {}) {
  if (!rows.length) return h('p', { class: 'muted empty-note' }, empty);
  const t = h('table', id ? { id } : {});
  t.append(h('thead', {}, h('tr', {}, columns.map(([name]) => h('th', {}, name)))));
  const body = h('tbody');
  for (const row of rows) body.append(h('tr', {}, columns.map(([, cell]) => h('td', {}, cell(row)))));
  t.append(body);
  return t;
}

function select(label, values, current, onchange) {
  const s = h('select', { 'aria-label': label, onchange: (e) => onchange(e.target.value) },
    values.map((v) => h('option', { value: v }, v)));
  s.value = current;
  return h('label', { class: 'picker' }, `${label} `, s);
}

const labelText = (labels) => Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
const ago = (t) => {
  if (!t) return 'never';
  const s = (Date.now() - Date.parse(t)) / 1000;
  return s < 90 ? `${Math.round(s)} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
};
const pct = (v) => (v === null || v === undefined ? '–' : `${(v * 100).toFixed(1)}%`);
const t = (s) => Date.parse(s);

// Rows of a detector's figures repeat the request figures once per score: one row per window and group.
function uniq(rows, key) {
  const seen = new Map();
  for (const r of rows) { const k = key(r); if (!seen.has(k)) seen.set(k, r); }
  return [...seen.values()];
}

// The request-weighted mean of a figure over windows: exact for means, a summary (not a quantile) for p99s.
function weighted(rows, field, weight = 'n') {
  let sum = 0, n = 0;
  for (const r of rows) if (r[field] !== null && r[weight]) { sum += r[field] * r[weight]; n += r[weight]; }
  return n ? sum / n : null;
}

const BUCKET_ORDER = ['high', 'medium', 'low', 'idle', 'warm', 'saturating', 'scaling'];
function bucketSort(values) {
  const size = (b) => {
    const m = /^<?(\d+)(k?)/.exec(b);
    return m ? (+m[1]) * (m[2] ? 1000 : 1) - (b.startsWith('<') ? 0.5 : 0) : Infinity;
  };
  return [...new Set(values)].sort((a, b) => {
    const ia = BUCKET_ORDER.indexOf(a), ib = BUCKET_ORDER.indexOf(b);
    if (ia >= 0 || ib >= 0) return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
    return size(a) - size(b) || a.localeCompare(b);
  });
}

// ---- incidents ---------------------------------------------------------------------------------

const SEVERITY = { critical: 0, warning: 1, info: 2 };
const incidentLink = (i) => h('a', { href: `#/incident?id=${i.incident_id}`, class: 'incident-link' }, i.title);
// The summary's first sentences: since when, the peak, how many requests.
const lead = (summary) => summary.split('. ').slice(0, 3).join('. ').replace(/\.?$/, '.');

function incidentCard(i) {
  const impact = i.impact || {};
  const facts = [
    `${i.alert_ids.length} alert${i.alert_ids.length === 1 ? '' : 's'}`,
    `${i.cluster_ids.length} cluster${i.cluster_ids.length === 1 ? '' : 's'}`,
    impact.bad_requests != null ? `${fmt(impact.bad_requests)} bad of ${fmt(impact.requests)} requests` : null,
  ].filter(Boolean).join(' · ');
  return h('article', { class: `incident-card ${i.severity}`, 'data-incident': i.incident_id },
    h('h3', {}, h('span', { class: `sev ${i.severity}` }, i.severity), ' ', incidentLink(i)),
    h('p', { class: 'muted' }, `${i.state === 'open' ? 'open' : 'resolved'} · since ${utc(t(i.started_at))} UTC · ${facts}`),
    h('p', {}, lead(i.summary)),
    i.suggested_fix ? h('p', {}, h('strong', {}, 'Fix first: '), i.suggested_fix) : null);
}

// The fleet's changes in a range, as marks every timeline draws: a dashed line at each, labelled with its kind.
async function changeMarks(r) {
  const body = await api(`/v1/changes?since=${iso(r.from)}&limit=500`);
  return body.changes.filter((c) => t(c.at) <= r.to).map((c) => ({ t: t(c.at), id: c.change_id, kind: 'change',
    label: `${c.kind} ${c.scope.deployment}`, change: c }));
}

// Incidents and alerts as bars over the range: what began when, and what overlapped; the changes as marks.
// `byDetector`: one lane per detector for its alerts (the overview, read at a glance), else one per alert.
function timeline(name, caption, r, incidents, alerts, clusters = [], marks = [], { byDetector = false } = {}) {
  const perDetector = new Map();
  for (const a of alerts) perDetector.set(a.detector, (perDetector.get(a.detector) || 0) + 1);
  const laneOf = (a) => byDetector
    ? `${a.detector} (${perDetector.get(a.detector)} alert${perDetector.get(a.detector) === 1 ? '' : 's'})`
    : `${a.detector} ${labelText(a.labels)}`;
  const bars = [
    ...incidents.map((i) => ({ id: i.incident_id, lane: `incident: ${i.title}`, start: t(i.started_at),
      end: i.resolved_at ? t(i.resolved_at) : null, label: i.title, kind: 'incident', severity: i.severity })),
    ...alerts.map((a) => ({ id: a.alert_id, lane: laneOf(a), start: t(a.started_at),
      end: a.resolved_at ? t(a.resolved_at) : null, label: `${labelText(a.labels)}: ${a.summary}`, kind: 'alert',
      severity: a.severity })),
    ...clusters.map((c) => ({ id: c.cluster_id, lane: `cluster ${labelText(c.signature)}`, start: t(c.window_start),
      end: t(c.window_end), label: c.summary, kind: 'cluster' })),
  ].filter((b) => (b.end ?? r.to) > r.from && b.start <= r.to);
  return lanes(name, caption, { bars, from: r.from, to: r.to, marks });
}

// The fleet over the range, from tenant_fairness's windows: every tenant's e2e p99 together, and requests per second.
async function fleetCharts(r, marks) {
  const rows = (await figures('tenant_fairness', r.from, r.to, { distinct: 'true',
    columns: 'window_start,window_end,tenant_id,n,aggregate_p99' })).rows;
  const windows = new Map();
  for (const x of rows) {
    const w = windows.get(x.window_end) || windows.set(x.window_end, { ...x, requests: 0 }).get(x.window_end);
    w.requests += x.n;
  }
  const ws = [...windows.values()];
  return h('div', { class: 'pair' },
    timeChart('fleet-p99', 'Fleet e2e p99 (every tenant together), per window', { from: r.from, to: r.to, unit: 'ms', marks,
      series: [{ name: 'fleet p99', points: ws.map((w) => ({ t: t(w.window_end), v: w.aggregate_p99 })) }] }),
    timeChart('fleet-rate', 'Requests per second, per window', { from: r.from, to: r.to, unit: 'req/s', marks,
      series: [{ name: 'requests/s', points: ws.map((w) => ({ t: t(w.window_end), v: w.requests / ((t(w.window_end) - t(w.window_start)) / 1000) })) }] }));
}

async function incidentsView(r) {
  const [body, marks] = await Promise.all([api(`/v1/incidents?since=${iso(r.from)}&limit=500`), changeMarks(r)]);
  const shown = body.incidents.sort((a, b) => (a.state === b.state ? t(b.started_at) - t(a.started_at) : a.state === 'open' ? -1 : 1));
  return [
    h('h2', {}, `Incidents in range (${shown.length})`),
    shown.length ? h('div', { id: 'incident-list' }, shown.map(incidentCard)) : h('p', { class: 'muted empty-note' }, 'No incident in this range.'),
    timeline('incidents-timeline', 'Incidents and the fleet\'s changes over the range', r, shown, [], [], marks),
  ];
}

async function incident(r, params) {
  const id = params.get('id');
  if (!id) return incidentsView(r);
  const [incidents, alerts, clusters] = await Promise.all([
    api('/v1/incidents?limit=10000'), api('/v1/alerts?limit=10000'), api('/v1/clusters?limit=10000'),
  ]);
  const i = incidents.incidents.find((x) => x.incident_id === id);
  if (!i) return [h('p', { class: 'error', role: 'alert' }, `No incident ${id}.`)];
  const mine = alerts.alerts.filter((a) => i.alert_ids.includes(a.alert_id));
  const found = clusters.clusters.filter((c) => i.cluster_ids.includes(c.cluster_id));
  // Its own range: from an hour before it began to its end (or now).
  const own = { from: t(i.started_at) - 36e5, to: (i.resolved_at ? t(i.resolved_at) : Date.now()) + 6e5 };
  const [marks, compared] = await Promise.all([changeMarks(own), api(`/v1/compare?incident=${id}&limit=10`)
    .catch((e) => ({ error: e.message }))]);
  const before = marks.filter((m) => i.change_ids.includes(m.id)).map((m) => m.change);
  const engine = i.engine || {};
  const engineRows = ['queue_depth', 'kv_cache_usage', 'preempted_share', 'cache_hit_ratio'].filter((k) => engine[k])
    .map((k) => ({ name: k, ...engine[k] }));
  const asShare = new Set(['kv_cache_usage', 'preempted_share', 'cache_hit_ratio']);
  const shown = (k, v) => (asShare.has(k) ? pct(v) : fmt(v));
  return [
    h('section', { id: 'incident', 'data-incident': i.incident_id },
      h('h2', {}, h('span', { class: `sev ${i.severity}` }, i.severity), ' ', i.title),
      h('p', { class: 'muted' }, `${i.state} · since ${utc(t(i.started_at))} UTC${i.resolved_at ? ` · resolved ${utc(t(i.resolved_at))} UTC` : ''}`),
      h('p', { id: 'incident-summary' }, i.summary),
      i.suggested_fix ? h('p', {}, h('strong', {}, 'Fix first: '), i.suggested_fix) : null),
    timeline('incident-timeline', 'Its alerts and clusters, and the fleet\'s changes, from an hour before it began', own, [i], mine, found, marks),
    h('section', {}, h('h2', {}, `Changed just before (${before.length})`), table([
      ['At', (c) => `${utc(t(c.at))} UTC`], ['Kind', (c) => c.kind], ['Deployment', (c) => c.scope.deployment],
      ['Before', (c) => labelText(c.before)], ['After', (c) => labelText(c.after)], ['Summary', (c) => c.summary],
    ], before, { id: 'incident-changes', empty: 'Nothing in its scope changed in the half hour before it.' })),
    h('section', {}, h('h2', {}, 'Its bad requests against the hour before it'), compared.error
      ? h('p', { class: 'muted empty-note', id: 'incident-compare' }, `Not compared: ${compared.error}`)
      : table([
        ['Dimension', (d) => d.dimension], ['Value', (d) => d.value],
        ['Of its bad requests', (d) => `${pct(d.a_share)} (${fmt(d.a_count)})`],
        ['The hour before', (d) => `${pct(d.b_share)} (${fmt(d.b_count)})`],
        ['Evidence', (d) => (d.passes ? `p ${d.p_value < 1e-300 ? '< 1e-300' : `= ${d.p_value.toPrecision(2)}`}` : 'not significant')],
      ], compared.differences.filter((d) => d.a_share > d.b_share), { id: 'incident-compare', empty: 'No value is over-represented among its bad requests.' })),
    h('section', {}, h('h2', {}, 'The engines in its first hour against the hour before'),
      table([['Fact', (x) => x.name], ['During', (x) => shown(x.name, x.during)], ['Before', (x) => shown(x.name, x.before)]],
        engineRows, { id: 'incident-engine', empty: 'No engine facts for its requests.' })),
    h('section', {}, h('h2', {}, `Alerts (${mine.length})`), table([
      ['Severity', (a) => h('span', { class: `sev ${a.severity}` }, a.severity)], ['Detector', (a) => a.detector],
      ['Group', (a) => labelText(a.labels)], ['Summary', (a) => a.summary], ['State', (a) => a.state],
      ['Since', (a) => `${utc(t(a.started_at))} UTC`],
    ], mine, { id: 'incident-alerts' })),
    h('section', {}, h('h2', {}, `Clusters (${found.length})`), table([
      ['Window end', (c) => `${utc(t(c.window_end))} UTC`], ['Signature', (c) => labelText(c.signature)],
      ['Symptom', (c) => c.symptom || ''], ['Summary', (c) => c.summary],
    ], found, { id: 'incident-clusters', empty: 'No cluster found for it.' })),
    h('section', {}, h('h2', {}, 'Example requests'),
      h('p', { id: 'incident-examples' }, i.example_trace_ids.length ? i.example_trace_ids.map((tid) => h('a', {
        class: 'trace', href: `#/request?trace=${tid}&at=${encodeURIComponent(i.updated_at)}` }, tid.slice(0, 8))) : 'none')),
  ];
}

// ---- views -------------------------------------------------------------------------------------

async function overview(r) {
  const [firing, recent, clusters, status, incidents, marks] = await Promise.all([
    api('/v1/alerts?state=firing&limit=200'), api('/v1/alerts?limit=200'), api('/v1/clusters?limit=200'), api('/v1/status'),
    api(`/v1/incidents?since=${iso(r.from)}&limit=500`), changeMarks(r),
  ]);
  const open = incidents.incidents.filter((i) => i.state === 'open')
    .sort((a, b) => SEVERITY[a.severity] - SEVERITY[b.severity] || t(a.started_at) - t(b.started_at));
  const inRange = (row, field) => t(row[field]) > r.from && t(row[field]) <= r.to;
  const resolved = recent.alerts.filter((a) => a.state === 'resolved' && a.resolved_at && inRange(a, 'resolved_at'));
  const latest = clusters.clusters.filter((c) => inRange(c, 'window_end'));
  const newest = latest.length ? latest[0].window_end : null;
  const top = latest.filter((c) => c.window_end === newest).slice(0, 10);
  const ing = status.ingest;
  const commitAge = ing.last_commit ? (Date.now() - t(ing.last_commit)) / 1000 : null;
  const tiles = [
    ['Ready', status.ready ? 'yes' : 'NO', !status.ready],
    ['Spans received/s', fmt(ing.received_per_second), false],
    ['Spans stored/s', fmt(ing.stored_per_second), false],
    ['Rejected spans', fmt(Object.values(ing.rejected).reduce((a, b) => a + b, 0)), Object.keys(ing.rejected).length > 0],
    ['Refused (retried)', fmt(Object.values(ing.refused).reduce((a, b) => a + b, 0)), Object.keys(ing.refused).length > 0],
    ['Writer queue', fmt(ing.queued), ing.queued > 0 && commitAge > 30],
    ['Last commit', ing.last_commit ? ago(ing.last_commit) : 'none yet', ing.queued > 0 && commitAge > 30],
  ];
  const failing = status.detectors.filter((d) => d.last_outcome && d.last_outcome !== 'ok');
  const episodes = recent.alerts.filter((a) => (a.resolved_at ? t(a.resolved_at) : r.to) > r.from);
  return [
    // The picture of the range first: what broke when, beside the fleet's p99 and traffic; then the incidents.
    h('section', { id: 'picture' },
      timeline('timeline', 'Incidents, alerts (a lane per detector) and the fleet\'s changes over the range', r,
        incidents.incidents, episodes, [], marks, { byDetector: true }),
      await fleetCharts(r, marks)),
    h('section', {}, h('h2', {}, `Open incidents (${open.length})`),
      open.length ? h('div', { id: 'incidents' }, open.map(incidentCard)) : h('p', { class: 'muted empty-note', id: 'incidents' }, 'No incident is open.')),
    h('section', {}, h('h2', {}, `Firing alerts (${firing.alerts.length})`),
      table([
        ['Severity', (a) => h('span', { class: `sev ${a.severity}` }, a.severity)],
        ['Detector', (a) => a.detector],
        ['Group', (a) => labelText(a.labels)],
        ['Summary', (a) => a.summary],
        ['Since', (a) => `${utc(t(a.started_at))} UTC`],
        ['Explanation', (a) => a.explanation || ''],
      ], firing.alerts, { id: 'firing', empty: 'No alert is firing.' })),
    h('section', {}, h('h2', {}, `Top clusters${newest ? ` · window ending ${utc(t(newest))} UTC` : ''}`),
      table([
        ['#', (c) => c.rank],
        ['Signature', (c) => labelText(c.signature)],
        ['Symptom', (c) => c.symptom || c.bad_reason || ''],
        ['Share of bad', (c) => pct(c.support)],
        ['Risk', (c) => `${fmt(c.risk_ratio)}×`],
        ['p', (c) => (c.p_value === null ? '–' : c.p_value.toExponential(1))],
        ['Suggested fix', (c) => c.suggested_fix],
        ['Examples', (c) => c.example_trace_ids.slice(0, 3).map((id) => h('a', {
          class: 'trace', href: `#/request?trace=${id}&at=${encodeURIComponent(c.window_end)}`,
        }, id.slice(0, 8)))],
      ], top, { id: 'clusters', empty: 'No cluster in this range.' })),
    h('section', { class: 'health' }, h('h2', {}, 'Ingest'),
      h('div', { class: 'tiles', id: 'ingest' }, tiles.map(([name, value, bad]) => h('div', { class: bad ? 'tile bad' : 'tile', 'data-tile': name },
        h('span', { class: 'tile-name' }, name), h('span', { class: 'tile-value' }, value)))),
      Object.keys(ing.rejected).length ? h('p', { class: 'muted' }, 'Rejected by reason: ',
        Object.entries(ing.rejected).map(([k, v]) => `${k} ${v}`).join(', ')) : null),
    h('section', { class: 'health' }, h('h2', {}, `Detectors${failing.length ? ` · ${failing.length} failing` : ''}`),
      table([
        ['Detector', (d) => d.detector],
        ['Last pass', (d) => ago(d.last_run)],
        ['Outcome', (d) => h('span', { class: d.last_outcome && d.last_outcome !== 'ok' ? 'sev critical' : '' }, d.last_outcome || '–')],
        ['Took', (d) => fmt(d.last_seconds, 's')],
        ['Failures (24 h)', (d) => `${d.failures_24h || 0} of ${d.runs_24h || 0}`],
        ['Error', (d) => d.last_error || ''],
      ], status.detectors, { id: 'detectors' })),
    h('section', {}, h('h2', {}, `Resolved in range (${resolved.length})`),
      table([
        ['Detector', (a) => a.detector], ['Group', (a) => labelText(a.labels)], ['Summary', (a) => a.summary],
        ['Resolved', (a) => `${utc(t(a.resolved_at))} UTC`],
      ], resolved, { empty: 'Nothing resolved in this range.' })),
  ];
}

// A chart is at most ~1,200 px wide: a series of more windows than this draws nothing more, so it asks for no more.
const SERIES_POINTS = 1500;

async function tokens(r, params) {
  // A day of every tenant's windows is tens of thousands of rows: list the groups, then fetch only the chosen one.
  const listed = (await figures('token_latency', r.from, r.to, { columns: 'grouping,model,deployment,tenant_id', distinct: 'true' })).rows;
  const groupOf = (x) => x.grouping === 'tenant' ? `${x.model} · ${x.deployment} · tenant ${x.tenant_id}` : `${x.model} · ${x.deployment}`;
  const ordered = [...listed.filter((x) => x.grouping !== 'tenant'), ...listed.filter((x) => x.grouping === 'tenant')];
  const groups = ordered.map(groupOf);
  const group = groups.includes(params.get('group')) ? params.get('group') : groups[0];
  const chosen = ordered[groups.indexOf(group)];
  const of = chosen ? Object.fromEntries(
    ['grouping', 'model', 'deployment', 'tenant_id'].filter((k) => chosen[k] !== null).map((k) => [k, chosen[k]])) : {};
  // The series at what the chart can draw; every breaching window in full, whatever the series keeps.
  const [body, breached] = chosen
    ? await Promise.all([figures('token_latency', r.from, r.to, { ...of, limit: SERIES_POINTS }),
      figures('token_latency', r.from, r.to, { ...of, breached: 'true' })])
    : [{ rows: [], config: null }, { rows: [] }];
  const mine = body.rows.filter((x) => groupOf(x) === group);
  const breaches = breached.rows.filter((x) => groupOf(x) === group);
  const ratio = body.config ? body.config.ratio_threshold : 2;
  const changes = (await changeMarks(r)).filter((m) => !chosen || m.change.scope.deployment === chosen.deployment);
  const chart = timeChart('tpot', `p99 time per output token, ${group || 'no group'}: the band runs from the 24-hour baseline p99 to ${ratio}× it (the alert threshold)`, {
    from: r.from, to: r.to, unit: 'ms',
    series: [{ name: 'tpot p99', points: mine.map((x) => ({ t: t(x.window_end), v: x.tpot_p99 })) },
      { name: 'tpot p50', points: mine.map((x) => ({ t: t(x.window_end), v: x.tpot_p50 })), dash: true }],
    band: mine.filter((x) => x.baseline_p99 !== null).map((x) => ({ t: t(x.window_end), lo: x.baseline_p99, hi: x.baseline_p99 * ratio })),
    bandName: `baseline p99 to ${ratio}×`,
    marks: [...breaches.map((x) => ({ t: t(x.window_end), label: x.reason || 'breach' })), ...changes],
  });
  breaches.reverse();
  return [
    h('div', { class: 'pickers' }, select('Model · deployment', groups, group, (v) => go('tokens', { group: v }))),
    chart,
    h('section', {}, h('h2', {}, `Breaching windows (${breaches.length})`), table([
      ['Window end', (x) => `${utc(t(x.window_end))} UTC`], ['p99', (x) => fmt(x.tpot_p99, 'ms')],
      ['Baseline p99', (x) => fmt(x.baseline_p99, 'ms')], ['Ratio', (x) => `${fmt(x.ratio)}×`], ['Reason', (x) => x.reason || ''],
      ['Prefill share', (x) => pct(x.prefill_share)], ['Queue share', (x) => pct(x.queue_share)],
      ['Preempted', (x) => pct(x.preempted_share)], ['KV usage p50', (x) => pct(x.kv_usage_p50)],
    ], breaches, { id: 'breaches', empty: 'No window breached in this range.' })),
  ];
}

async function tenants(r, params) {
  // Its rows repeat per score: ask only for the latency columns, each row once.
  const rows = (await figures('tenant_fairness', r.from, r.to, { distinct: 'true',
    columns: 'window_end,tenant_id,n,latency_p99,ttft_p99,aggregate_p99,aggregate_ttft_p99,jain_index' })).rows;
  const byTenant = new Map();
  for (const x of rows) (byTenant.get(x.tenant_id) || byTenant.set(x.tenant_id, []).get(x.tenant_id)).push(x);
  const names = [...byTenant.keys()].sort((a, b) => byTenant.get(b).reduce((s, x) => s + x.n, 0) - byTenant.get(a).reduce((s, x) => s + x.n, 0));
  const chosen = params.get('tenant');
  const shown = chosen && byTenant.has(chosen) ? [chosen] : names.slice(0, 8);
  const windows = uniq(rows, (x) => x.window_end);
  const marks = await changeMarks(r);
  const lines = (field, aggregate) => [
    ...shown.map((n) => ({ name: `tenant ${n}`, points: byTenant.get(n).map((x) => ({ t: t(x.window_end), v: x[field] })) })),
    { name: 'all tenants', color: '#333', dash: true, points: windows.map((x) => ({ t: t(x.window_end), v: x[aggregate] })) },
  ];
  return [
    h('div', { class: 'pickers' }, select('Tenant', ['all (top 8 by requests)', ...names], chosen && byTenant.has(chosen) ? chosen : 'all (top 8 by requests)',
      (v) => go('tenants', { tenant: v.startsWith('all') ? null : v }))),
    timeChart('tenant-e2e', 'End-to-end p99 per tenant against every tenant together', { from: r.from, to: r.to, unit: 'ms', marks, series: lines('latency_p99', 'aggregate_p99') }),
    timeChart('tenant-ttft', 'Time-to-first-token p99 per tenant against every tenant together', { from: r.from, to: r.to, unit: 'ms', marks, series: lines('ttft_p99', 'aggregate_ttft_p99') }),
    timeChart('jain', "Jain's fairness index of the tenants' p99s (1 is perfectly even)", { from: r.from, to: r.to, marks,
      series: [{ name: "Jain's index", points: windows.map((x) => ({ t: t(x.window_end), v: x.jain_index })) }] }),
    ...await sloCharts(r, chosen, marks),
  ];
}

// The per-tenant SLOs (slo_burn): each SLO and tenant's burn rate over the last hour, and its budget left.
async function sloCharts(r, chosen, marks = []) {
  const rows = (await figures('slo_burn', r.from, r.to, { burn_window: '1h',
    columns: 'window_end,slo,tenant_id,burn_rate,budget_remaining' })).rows;
  if (!rows.length) {
    return [h('section', {}, h('h2', {}, 'SLOs'), h('p', { class: 'muted' },
      'No SLO figures in this range: SLOs are configured under detectors.slo_burn.slos (docs/detectors.md#slo_burn).'))];
  }
  const name = (x) => (x.tenant_id === null ? x.slo : `${x.slo} · ${x.tenant_id}`);
  const mine = chosen ? rows.filter((x) => x.tenant_id === chosen || x.tenant_id === null) : rows;
  const byName = new Map();
  for (const x of mine) (byName.get(name(x)) || byName.set(name(x), []).get(name(x))).push(x);
  // The worst first: the least budget left at the latest window.
  const last = (xs) => xs.reduce((a, b) => (b.window_end > a.window_end ? b : a));
  const shown = [...byName.keys()].sort((a, b) => last(byName.get(a)).budget_remaining - last(byName.get(b)).budget_remaining).slice(0, 8);
  const lines = (field) => shown.map((n) => ({ name: n, points: byName.get(n).map((x) => ({ t: t(x.window_end), v: x[field] })) }));
  return [
    h('h2', {}, 'SLOs'),
    timeChart('slo-burn', 'Error-budget burn rate over the last hour, per SLO and tenant (14.4 pages when the last 5 minutes agree)', {
      from: r.from, to: r.to, unit: '×', marks, series: lines('burn_rate') }),
    timeChart('slo-budget', 'Share of the error budget left over the SLO window', { from: r.from, to: r.to, marks, series: lines('budget_remaining') }),
  ];
}

// A curve over buckets for this range against the same range a day earlier.
function curve(name, caption, now, before, field, unit, { weight = 'n' } = {}) {
  const categories = bucketSort([...now, ...before].map((x) => x.bucket));
  const at = (rows, b) => weighted(rows.filter((x) => x.bucket === b), field, weight);
  return barChart(name, caption, { categories, unit, series: [
    { name: 'this range', values: categories.map((b) => at(now, b)) },
    { name: 'a day earlier', values: categories.map((b) => at(before, b)), color: '#bab0ac' },
  ] });
}

const pair = (title, ...charts) => h('section', {}, h('h2', {}, title), h('div', { class: 'pair' }, charts));

async function curves(r, params) {
  const names = ['cache_curve', 'saturation', 'traffic_pattern', 'replica_skew', 'quantization_delta', 'context_length'];
  const [now, before] = await Promise.all([
    Promise.all(names.map((n) => figures(n, r.from, r.to))),
    Promise.all(names.slice(0, 2).map((n) => figures(n, r.from - DAY, r.to - DAY))),
  ]);
  const [cache, saturation, traffic, replicas, quant, context] = now.map((b) => b.rows);
  const scoreNames = [...new Set([...cache, ...replicas, ...context].map((x) => x.score_name).filter(Boolean))].sort();
  const score = scoreNames.includes(params.get('score')) ? params.get('score') : scoreNames[0];
  const ofScore = (rows) => rows.filter((x) => x.score_name === score);
  const perWindow = (rows, key) => uniq(rows, (x) => `${x.window_end}|${key(x)}`);
  const out = [h('div', { class: 'pickers' }, select('Score', scoreNames.length ? scoreNames : ['none'], score || 'none', (v) => go('curves', { score: v })))];
  out.push(pair('KV-cache hit buckets',
    curve('cache-score', `${score} mean by cache-hit bucket`, ofScore(cache), ofScore(before[0].rows), 'score_mean', '', { weight: 'score_n' }),
    curve('cache-latency', 'e2e p99 by cache-hit bucket (request-weighted mean of the 5-minute windows\' p99s)',
      perWindow(cache, (x) => x.bucket), perWindow(before[0].rows, (x) => x.bucket), 'latency_p99', 'ms')));
  out.push(pair('Saturation buckets (queue depth per replica)',
    curve('saturation-score', `${score} mean by saturation bucket`, ofScore(saturation), ofScore(before[1].rows), 'score_mean', '', { weight: 'score_n' }),
    curve('saturation-latency', 'e2e p99 by saturation bucket (request-weighted mean of the windows\' p99s)',
      perWindow(saturation, (x) => x.bucket), perWindow(before[1].rows, (x) => x.bucket), 'latency_p99', 'ms')));
  out.push(h('h2', {}, 'Traffic pattern'));
  // One row per window and pattern (its figures repeat once per score).
  const steps = new Map();
  for (const x of perWindow(traffic, (y) => y.pattern)) {
    const s = steps.get(x.window_end) || steps.set(x.window_end, { start: t(x.window_start), end: t(x.window_end), counts: {} }).get(x.window_end);
    s.counts[x.pattern] = (s.counts[x.pattern] || 0) + x.n;
  }
  const patterns = ['steady', 'sustained', 'burst'].concat([...new Set(traffic.map((x) => x.pattern))].filter((p) => !['steady', 'sustained', 'burst'].includes(p)));
  out.push(shareTimeline('traffic', 'Share of requests by traffic pattern, per window', { from: r.from, to: r.to, names: patterns,
    steps: [...steps.values()].map((s) => {
      const total = Object.values(s.counts).reduce((a, b) => a + b, 0);
      return { ...s, shares: Object.fromEntries(Object.entries(s.counts).map(([k, v]) => [k, v / total])) };
    }) }));
  const reps = bucketSort(replicas.map((x) => x.replica_id));
  const repRows = perWindow(replicas, (x) => x.replica_id);
  const per = (rows, rep, field, w = 'n') => weighted(rows.filter((x) => x.replica_id === rep), field, w);
  out.push(pair('Replicas against the fleet', barChart('replica-latency', 'e2e p99 per replica against the rest of the fleet (request-weighted over windows)', { categories: reps, unit: 'ms', series: [
    { name: 'replica', values: reps.map((p) => per(repRows, p, 'latency_p99')) },
    { name: 'rest of the fleet', values: reps.map((p) => per(repRows, p, 'fleet_latency_p99', 'fleet_n')), color: '#bab0ac' }] }),
  barChart('replica-score', `${score} mean per replica against the rest of the fleet`, { categories: reps, series: [
    { name: 'replica', values: reps.map((p) => per(ofScore(replicas), p, 'score_mean', 'score_n')) },
    { name: 'rest of the fleet', values: reps.map((p) => per(ofScore(replicas), p, 'fleet_score_mean', 'score_n')), color: '#bab0ac' }] })));
  // A baseline variant is the reference, not drawn against itself: the bars are the other variants.
  const isBaseline = (x) => x.baseline_quantization !== null && x.quantization === x.baseline_quantization;
  const variants = [...new Set(quant.filter((x) => !isBaseline(x)).map((x) => `${x.model} · ${x.quantization}`))].sort();
  const baselines = [...new Set(quant.filter(isBaseline).map((x) => `${x.model} · ${x.quantization}`))].sort();
  const qv = (rows, v, field, w) => weighted(rows.filter((x) => `${x.model} · ${x.quantization}` === v), field, w);
  const qRows = perWindow(quant, (x) => `${x.model}|${x.quantization}`);
  const against = baselines.length ? ` (baseline: ${baselines.join(', ')})` : '';
  out.push(pair('Quantized variants against their baseline', barChart('quant-latency', `e2e p99 per variant against its baseline variant${against}`, { categories: variants, unit: 'ms', series: [
    { name: 'variant', values: variants.map((v) => qv(qRows, v, 'latency_p99', 'n')) },
    { name: 'baseline', values: variants.map((v) => qv(qRows, v, 'baseline_latency_p99', 'baseline_n')), color: '#bab0ac' }] }),
  barChart('quant-score', `${score} mean per variant against its baseline variant${against}`, { categories: variants, series: [
    { name: 'variant', values: variants.map((v) => qv(ofScore(quant), v, 'score_mean', 'score_n')) },
    { name: 'baseline', values: variants.map((v) => qv(ofScore(quant), v, 'baseline_score_mean', 'score_n')), color: '#bab0ac' }] })));
  const prompts = bucketSort(context.map((x) => x.prompt_bucket)), outputs = bucketSort(context.map((x) => x.output_bucket));
  const cells = (rows, field, w) => {
    const m = new Map();
    for (const p of prompts) for (const o of outputs) {
      const mine = rows.filter((x) => x.prompt_bucket === p && x.output_bucket === o);
      const v = weighted(mine, field, w);
      if (v !== null) m.set(`${p}|${o}`, { v, n: mine.reduce((s, x) => s + x[w], 0) });
    }
    return m;
  };
  out.push(pair('Context length × output length', heatmap('context-latency', 'e2e p99 by prompt bucket (rows) and output bucket (columns)', { rows: prompts, cols: outputs, unit: 'ms',
    cells: cells(perWindow(context, (x) => `${x.prompt_bucket}|${x.output_bucket}`), 'latency_p99', 'n') }),
  heatmap('context-score', `${score} mean by prompt bucket and output bucket`, { rows: prompts, cols: outputs, higherIsWorse: false,
    cells: cells(ofScore(context), 'score_mean', 'score_n') })));
  return out;
}

async function request(r, params) {
  const id = (params.get('trace') || '').trim().toLowerCase();
  const form = h('form', { class: 'pickers', onsubmit: (e) => { e.preventDefault(); go('request', { trace: e.target.trace.value.trim(), at: null }); } },
    h('label', {}, 'Trace id ', h('input', { name: 'trace', value: id, size: 34, pattern: '[0-9a-fA-F]{32}', required: '' })),
    h('button', { type: 'submit' }, 'Show'));
  if (!id) return [form, h('p', { class: 'muted' }, 'Open a trace from a cluster\'s examples on the overview, or paste its id.')];
  // A cluster's window bounds the search: a day of spans need not be scanned for one trace.
  const at = params.get('at') ? t(params.get('at')) : null;
  const bound = at ? `?from=${iso(at - 36e5)}&to=${iso(at + 36e5)}` : '';
  const body = await api(`/v1/traces/${id}${bound}`);
  const depth = new Map();
  const byId = new Map(body.spans.map((s) => [s.span_id, s]));
  const level = (s) => { let d = 0, p = s; while (p && p.parent_span_id && byId.has(p.parent_span_id) && d < 20) { d++; p = byId.get(p.parent_span_id); } return d; };
  for (const s of body.spans) depth.set(s.span_id, level(s));
  const spans = body.spans.map((s) => ({ span_id: s.span_id, name: s.name, start: t(s.start_time), end: t(s.end_time),
    depth: depth.get(s.span_id), error: s.status_code === 'ERROR' }));
  // Millisecond timestamps lose the spans' sub-millisecond parts; durations come from duration_ms instead.
  body.spans.forEach((s, i) => { spans[i].end = spans[i].start + s.duration_ms; });
  const out = [form, waterfall('spans', `Trace ${id}: ${body.spans.length} spans`, spans)];
  const req = body.requests || [];
  if (req.length) {
    const skip = new Set(['attributes']);
    const cols = Object.keys(req[0]).filter((k) => !skip.has(k));
    out.push(h('section', {}, h('h2', {}, 'The request as the request model has it'),
      h('table', { id: 'request-columns', class: 'kv' }, h('tbody', {}, cols.map((k) => h('tr', {}, h('th', {}, k),
        req.map((row) => h('td', { 'data-column': k }, row[k] === null ? '–' : typeof row[k] === 'number' ? fmt(row[k]) : String(row[k])))))))));
  }
  out.push(h('section', {}, h('h2', {}, 'Scores'), table([
    ['Name', (s) => s.name], ['Score', (s) => fmt(s.score)], ['Label', (s) => s.label || ''], ['Source', (s) => s.source],
    ['Explanation', (s) => s.explanation || ''],
  ], body.scores || [], { id: 'scores', empty: 'No score for this trace.' })));
  const engine = body.engine || [];
  if (engine.length) {
    out.push(h('h2', {}, 'Engine metrics of its replica around it'));
    const start = Math.min(...spans.map((s) => s.start)), end = Math.max(...spans.map((s) => s.end));
    for (const chart of engineCharts(engine, start, end)) out.push(chart);
  }
  return out;
}

// Per replica and metric, the points in time order; cumulative ones as what moved since the report before.
function engineSeries(engine) {
  const out = new Map();
  for (const p of engine) {
    const key = p.metric || p.name;
    const byReplica = out.get(key) || out.set(key, new Map()).get(key);
    (byReplica.get(p.replica_id) || byReplica.set(p.replica_id, []).get(p.replica_id)).push(p);
  }
  for (const byReplica of out.values()) {
    for (const [rep, points] of byReplica) {
      points.sort((a, b) => t(a.time) - t(b.time));
      byReplica.set(rep, points.map((p, i) => ({ t: t(p.time), name: p.name, cumulative: p.kind === 'cumulative',
        v: p.kind === 'cumulative' ? (i ? Math.max(p.value - points[i - 1].value, 0) : null) : p.value })));
    }
  }
  return out;
}

function engineCharts(engine, start, end) {
  const series = engineSeries(engine);
  const marks = [{ t: start, label: 'request starts' }, { t: end, label: 'ends' }];
  const opts = { from: start - 6e4, to: end + 6e4, marks };
  const charts = [];
  // Ratios of two counters' increases say more than either: cache hits per query, tokens per engine step.
  const ratio = (name, caption, num, den) => {
    if (!series.has(num) || !series.has(den)) return;
    const lines = [...series.get(num)].map(([rep, pts]) => {
      const d = new Map(series.get(den).get(rep).map((p) => [p.t, p.v]));
      return { name: rep, points: pts.map((p) => ({ t: p.t, v: d.get(p.t) ? p.v / d.get(p.t) : null })) };
    });
    charts.push(timeChart(name, caption, { ...opts, series: lines }));
    series.delete(num);
    series.delete(den);
  };
  ratio('engine-prefix-hit-ratio', 'prefix cache hit ratio per report (hits / queries)', 'prefix_cache_hits', 'prefix_cache_queries');
  ratio('engine-step-tokens', 'tokens per engine step (mean per report)', 'step_tokens_sum', 'step_tokens_count');
  for (const [key, byReplica] of [...series.entries()].sort()) {
    const first = [...byReplica.values()][0][0];
    charts.push(timeChart(`engine-${key}`, `${first.name}${first.cumulative ? ' (increase per report)' : ''}`, {
      ...opts, series: [...byReplica].map(([rep, pts]) => ({ name: rep, points: pts })) }));
  }
  return charts;
}

const VIEWS = { overview, incident, tokens, tenants, curves, request };

// ---- the shell ---------------------------------------------------------------------------------

async function render() {
  const mine = ++generation;
  const notes = capped = [];
  const { view: name, params } = state();
  const r = range(params);
  syncControls(params, r);
  // Moving to another page keeps the range and the refresh; the page's own selections stay behind.
  const common = new URLSearchParams([...params].filter(([k]) => ['range', 'from', 'to', 'refresh'].includes(k)));
  document.querySelectorAll('nav a').forEach((a) => {
    a.classList.toggle('active', a.dataset.view === name);
    a.setAttribute('href', `#/${a.dataset.view}?${common}`);
  });
  document.body.dataset.rendered = '';
  const started = performance.now();
  const fn = VIEWS[name] || overview;
  let nodes;
  try {
    nodes = await fn(r, params);
  } catch (e) {
    if (e.message === 'signed out') return;
    nodes = [h('p', { class: 'error', role: 'alert' }, `Could not load this view: ${e.message}`)];
  }
  if (mine !== generation) return; // a newer render started meanwhile
  view.replaceChildren(h('p', { class: 'muted range' }, `${utc(r.from)} – ${utc(r.to)} UTC`),
    ...[cappedNote(notes)].filter(Boolean), ...nodes);
  fitText(view);
  document.getElementById('updated').textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  document.body.dataset.view = name;
  document.body.dataset.renderMs = String(Math.round(performance.now() - started));
  document.body.dataset.rendered = '1';
  clearTimeout(timer);
  const every = +params.get('refresh') || 0;
  if (every > 0) timer = setTimeout(render, every * 1000);
}

function syncControls(params, r) {
  const rangeSel = document.getElementById('range');
  rangeSel.value = r.label;
  document.getElementById('custom').hidden = r.label !== 'custom';
  document.getElementById('from').value = new Date(r.from).toISOString().slice(0, 16);
  document.getElementById('to').value = new Date(r.to).toISOString().slice(0, 16);
  document.getElementById('refresh').value = params.get('refresh') || '0';
}

document.getElementById('range').addEventListener('change', (e) => {
  const v = e.target.value;
  if (v === 'custom') {
    document.getElementById('custom').hidden = false;
    return;
  }
  go(state().view, { range: v, from: null, to: null });
});
document.getElementById('apply').addEventListener('click', () => {
  go(state().view, { range: 'custom', from: document.getElementById('from').value, to: document.getElementById('to').value });
});
document.getElementById('refresh').addEventListener('change', (e) => go(state().view, { refresh: e.target.value === '0' ? null : e.target.value }));
window.addEventListener('hashchange', render);
window.addEventListener('resize', () => fitText(view));
render();
