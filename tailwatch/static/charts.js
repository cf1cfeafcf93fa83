// Charts as plain SVG. Every drawn value carries data-series, data-x and data-v (and a <title> a person can hover),
// so what a chart shows can be read back and checked against the data it was drawn from.

const NS = 'http://www.w3.org/2000/svg';
export const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
  '#9c755f', '#bab0ac'];
// The top margin holds the y axis's unit, clear of the top tick; the left one six-character tick labels at the
// size a half-width chart scales its text to (about 1.5 times).
const W = 860, H = 240, M = { l: 76, r: 12, t: 24, b: 28 };

function svgEl(tag, attrs = {}, parent = null) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function title(e, text) { svgEl('title', {}, e).textContent = text; }

export function fmt(v, unit = '') {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  const a = Math.abs(v);
  if (Number.isInteger(v)) return unit ? `${v} ${unit}` : String(v);
  const s = a >= 1000 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toFixed(3);
  return unit ? `${s} ${unit}` : s;
}

export function utc(t) { return new Date(t).toISOString().slice(0, 16).replace('T', ' '); }

function niceTicks(lo, hi, n = 5) {
  if (!(hi > lo)) { hi = lo + 1; }
  const step0 = (hi - lo) / n, p = 10 ** Math.floor(Math.log10(step0));
  const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= step0);
  const ticks = [];
  for (let v = Math.floor(lo / step) * step; ticks.length < 2 || ticks.at(-1) < hi - 1e-9; v += step) ticks.push(+v.toFixed(10));
  return ticks;
}

// Ticks on whole minutes or hours (UTC), about `n` of them between from and to.
const TIME_STEPS = [6e4, 3e5, 9e5, 18e5, 36e5, 108e5, 216e5, 432e5, 864e5]
function timeTicks(from, to, n = 6) {
  const step = TIME_STEPS.find((s) => (to - from) / s <= n) || TIME_STEPS.at(-1);
  const ticks = [];
  for (let v = Math.ceil(from / step) * step; v <= to; v += step) ticks.push(v);
  return ticks;
}

function frame(name, caption) {
  const fig = document.createElement('figure');
  fig.className = 'chart';
  const cap = document.createElement('figcaption');
  cap.textContent = caption;
  fig.appendChild(cap);
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, 'data-chart': name, role: 'img', 'aria-label': caption });
  fig.appendChild(svg);
  return { fig, svg };
}

// What a chart shows when the range holds nothing to draw.
function empty(fig, svg) {
  svgEl('text', { x: W / 2, y: H / 2, class: 'empty', 'text-anchor': 'middle' }, svg).textContent = 'no figures in this range';
  return fig;
}

// The legend names what is drawn; a series with nothing to draw is said to be absent, not listed as if drawn.
function legend(fig, items) {
  const ul = document.createElement('ul');
  ul.className = 'legend';
  for (const { name, color, dash, absent } of items) {
    const li = document.createElement('li');
    if (absent) {
      li.className = 'absent';
      li.textContent = `${name}: no figures to draw in this range`;
    } else {
      const sw = document.createElement('span');
      sw.className = dash ? 'swatch dashed' : 'swatch';
      sw.style.setProperty('--c', color);
      li.append(sw, name);
    }
    ul.appendChild(li);
  }
  fig.appendChild(ul);
}

const drawn = (v) => v !== null && v !== undefined && Number.isFinite(v);

// Chart text is sized in the SVG's own units, which the page scales to its width: a chart drawn at 560 px of
// an 860-unit view would print 11-unit text at 7 px. Once a chart is on the page, its scale is set so that
// text renders at its CSS size (at least 11 px) whatever the chart's width.
export function fitText(root) {
  for (const svg of root.querySelectorAll('svg[data-chart]')) {
    const width = svg.getBoundingClientRect().width;
    if (width > 0) svg.style.setProperty('--k', String(svg.viewBox.baseVal.width / width));
  }
}

function timeAxis(svg, x, from, to) {
  const ticks = timeTicks(from, to);
  const days = to - from > 864e5;
  for (const t of ticks) {
    svgEl('text', { x: x(t), y: H - 8, class: 'tick', 'text-anchor': 'middle' }, svg).textContent = days ? utc(t).slice(5) : utc(t).slice(11);
  }
}

function yAxis(svg, lo, hi, unit) {
  const ticks = niceTicks(lo, hi);
  const y = (v) => M.t + (H - M.t - M.b) * (1 - (v - ticks[0]) / (ticks.at(-1) - ticks[0] || 1));
  for (const t of ticks) {
    svgEl('line', { x1: M.l, x2: W - M.r, y1: y(t), y2: y(t), class: 'grid' }, svg);
    svgEl('text', { x: M.l - 6, y: y(t) + 4, class: 'tick', 'text-anchor': 'end' }, svg).textContent = fmt(t);
  }
  // Above the plot and right of the axis: the tick labels are left of it, so they never meet.
  if (unit) svgEl('text', { x: M.l + 4, y: M.t - 8, class: 'unit' }, svg).textContent = unit;
  return y;
}

// Lines over time: series [{name, points: [{t, v}], dash}], an optional band [{t, lo, hi}] drawn under them,
// and marks [{t, label}] as labelled ticks on the time axis (the reason tags of breaching windows).
export function timeChart(name, caption, { series, band = null, bandName = '', marks = [], unit = '', from, to }) {
  const { fig, svg } = frame(name, caption);
  const values = series.flatMap((s) => s.points.map((p) => p.v)).concat(band ? band.flatMap((b) => [b.lo, b.hi]) : [])
    .filter((v) => v !== null && Number.isFinite(v));
  if (!values.length) {
    return empty(fig, svg);
  }
  const lo = Math.min(0, ...values), hi = Math.max(...values) * 1.08;
  const y = yAxis(svg, lo, hi, unit);
  const x = (t) => M.l + (W - M.l - M.r) * ((t - from) / (to - from || 1));
  timeAxis(svg, x, from, to);
  const items = [];
  if (band && band.length) {
    const up = band.map((b) => `${x(b.t)},${y(b.hi)}`), down = band.slice().reverse().map((b) => `${x(b.t)},${y(b.lo)}`);
    const poly = svgEl('polygon', { points: up.concat(down).join(' '), class: 'band', 'data-series': bandName }, svg);
    title(poly, bandName);
    for (const b of band) {
      svgEl('g', { class: 'band-pt', 'data-series': bandName, 'data-x': new Date(b.t).toISOString(), 'data-lo': b.lo, 'data-hi': b.hi }, svg);
    }
    items.push({ name: bandName, color: '#c9d7e8' });
  }
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    const pts = s.points.filter((p) => p.v !== null && Number.isFinite(p.v)).sort((a, b) => a.t - b.t);
    // A gap of more than two evaluation steps breaks the line: no figure there, and none is drawn.
    const steps = pts.slice(1).map((p, k) => p.t - pts[k].t).sort((a, b) => a - b);
    const step = steps.length ? steps[Math.floor(steps.length / 2)] : Infinity;
    let d = '';
    pts.forEach((p, k) => { d += `${k && p.t - pts[k - 1].t <= 2.5 * step ? 'L' : 'M'}${x(p.t)},${y(p.v)}`; });
    svgEl('path', { d, class: 'line', stroke: color, 'stroke-dasharray': s.dash ? '5 4' : 'none', 'data-series': s.name }, svg);
    for (const p of pts) {
      const c = svgEl('circle', { cx: x(p.t), cy: y(p.v), r: 2.5, fill: color, class: 'pt',
        'data-series': s.name, 'data-x': new Date(p.t).toISOString(), 'data-v': p.v }, svg);
      title(c, `${s.name} · ${utc(p.t)} UTC · ${fmt(p.v, unit)}`);
    }
    items.push({ name: s.name, color, dash: s.dash, absent: !pts.length });
  });
  marks.filter((m) => m.t >= from && m.t <= to).forEach((m, i) => {
    const g = svgEl('g', { class: `mark ${m.kind || ''}`, 'data-x': new Date(m.t).toISOString(), 'data-label': m.label,
      ...(m.id ? { 'data-id': m.id } : {}) }, svg);
    svgEl('line', { x1: x(m.t), x2: x(m.t), y1: M.t, y2: H - M.b, class: 'mark-line' }, g);
    // Neighbouring labels alternate between two heights so they do not print over each other.
    svgEl('text', { x: x(m.t) + 3, y: M.t + 10 + (i % 2) * 12, class: 'mark-text' }, g).textContent = m.label;
    title(g, `${utc(m.t)} UTC: ${m.label}`);
  });
  legend(fig, items);
  return fig;
}

// Grouped bars over categories: series [{name, values: [v per category]}].
export function barChart(name, caption, { categories, series, unit = '' }) {
  const { fig, svg } = frame(name, caption);
  const values = series.flatMap((s) => s.values).filter((v) => v !== null && Number.isFinite(v));
  if (!values.length || !categories.length) {
    return empty(fig, svg);
  }
  const y = yAxis(svg, Math.min(0, ...values), Math.max(...values) * 1.08, unit);
  const band = (W - M.l - M.r) / categories.length, bw = (band * 0.8) / series.length;
  categories.forEach((c, ci) => {
    svgEl('text', { x: M.l + band * (ci + 0.5), y: H - 8, class: 'tick', 'text-anchor': 'middle' }, svg).textContent = c;
    series.forEach((s, si) => {
      const v = s.values[ci];
      if (v === null || v === undefined || !Number.isFinite(v)) return;
      const x0 = M.l + band * ci + band * 0.1 + bw * si;
      const r = svgEl('rect', { x: x0, y: Math.min(y(v), y(0)), width: Math.max(bw - 2, 1), height: Math.abs(y(0) - y(v)),
        fill: s.color || PALETTE[si % PALETTE.length], class: 'bar', 'data-series': s.name, 'data-x': c, 'data-v': v }, svg);
      title(r, `${s.name} · ${c}: ${fmt(v, unit)}`);
    });
  });
  legend(fig, series.map((s, i) => ({ name: s.name, color: s.color || PALETTE[i % PALETTE.length],
    absent: !s.values.some(drawn) })));
  return fig;
}

// Cells of rows × columns coloured by value (darker is worse when higherIsWorse).
export function heatmap(name, caption, { rows, cols, cells, unit = '', higherIsWorse = true }) {
  const { fig, svg } = frame(name, caption);
  const vals = [...cells.values()].map((c) => c.v).filter(Number.isFinite);
  if (!vals.length) {
    return empty(fig, svg);
  }
  const lo = Math.min(...vals), hi = Math.max(...vals);
  const cw = (W - M.l - 30) / cols.length, ch = (H - M.t - M.b) / rows.length;
  rows.forEach((r, ri) => {
    svgEl('text', { x: M.l - 6, y: M.t + ch * (ri + 0.5) + 4, class: 'tick', 'text-anchor': 'end' }, svg).textContent = r;
    cols.forEach((c, ci) => {
      const cell = cells.get(`${r}|${c}`);
      const x0 = M.l + cw * ci, y0 = M.t + ch * ri;
      if (!cell) return;
      const f = hi > lo ? (cell.v - lo) / (hi - lo) : 0.5;
      const heat = higherIsWorse ? f : 1 - f;
      const rect = svgEl('rect', { x: x0 + 1, y: y0 + 1, width: cw - 2, height: ch - 2, class: 'cell',
        fill: `hsl(${(1 - heat) * 120}, 55%, ${72 - heat * 25}%)`, 'data-series': r, 'data-x': c, 'data-v': cell.v }, svg);
      title(rect, `prompt ${r} × output ${c}: ${fmt(cell.v, unit)} (n=${cell.n})`);
      svgEl('text', { x: x0 + cw / 2, y: y0 + ch / 2 + 4, class: 'cell-text', 'text-anchor': 'middle' }, svg)
        .textContent = `${fmt(cell.v, unit)}  n=${cell.n}`;
    });
  });
  cols.forEach((c, ci) => {
    svgEl('text', { x: M.l + cw * (ci + 0.5), y: H - 8, class: 'tick', 'text-anchor': 'middle' }, svg).textContent = c;
  });
  return fig;
}

// A timeline of shares: per time step, stacked segments [{name, share}] (traffic pattern labels).
export function shareTimeline(name, caption, { steps, names, from, to }) {
  const { fig, svg } = frame(name, caption);
  if (!steps.length) {
    return empty(fig, svg);
  }
  const x = (t) => M.l + (W - M.l - M.r) * ((t - from) / (to - from || 1));
  const y = yAxis(svg, 0, 1, 'share');
  for (const s of steps) {
    let acc = 0;
    names.forEach((n, i) => {
      const share = s.shares[n] || 0;
      if (!share) return;
      const r = svgEl('rect', { x: x(s.start), y: y(acc + share), width: Math.max(x(s.end) - x(s.start) - 0.5, 1),
        height: y(acc) - y(acc + share), fill: PALETTE[i % PALETTE.length], class: 'seg',
        'data-series': n, 'data-x': new Date(s.end).toISOString(), 'data-v': share }, svg);
      title(r, `${utc(s.start)}–${utc(s.end).slice(11)} UTC · ${n}: ${(share * 100).toFixed(0)}% of requests`);
      acc += share;
    });
  }
  timeAxis(svg, x, from, to);
  legend(fig, names.map((n, i) => ({ name: n, color: PALETTE[i % PALETTE.length],
    absent: !steps.some((s) => s.shares[n]) })));
  return fig;
}

// A trace's spans as bars on one time axis, children under their parents.
export function waterfall(name, caption, spans) {
  const { fig, svg } = frame(name, caption);
  const t0 = Math.min(...spans.map((s) => s.start)), t1 = Math.max(...spans.map((s) => s.end));
  const h = M.t + 8 + spans.length * 22 + M.b;
  svg.setAttribute('viewBox', `0 0 ${W} ${h}`);
  // Names in a column on the left and durations in one on the right, dark on white: never printed over a bar.
  const left = 200, right = W - 76;
  const x = (t) => left + (right - left) * ((t - t0) / (t1 - t0 || 1));
  spans.forEach((s, i) => {
    const yy = M.t + i * 22;
    svgEl('text', { x: 4 + s.depth * 10, y: yy + 14, class: 'label' }, svg).textContent = s.name.slice(0, 28);
    const r = svgEl('rect', { x: x(s.start), y: yy + 3, width: Math.max(x(s.end) - x(s.start), 1.5), height: 14,
      class: s.error ? 'span err' : 'span', 'data-series': s.span_id, 'data-x': s.name, 'data-v': s.end - s.start }, svg);
    title(r, `${s.name}: ${fmt(s.end - s.start, 'ms')} from +${fmt(s.start - t0, 'ms')}`);
    svgEl('text', { x: W - 4, y: yy + 14, class: 'label', 'text-anchor': 'end' }, svg).textContent = fmt(s.end - s.start, 'ms');
  });
  // The time axis: milliseconds since the trace's first span began.
  const axis = h - M.b + 4;
  svgEl('line', { x1: left, x2: right, y1: axis, y2: axis, class: 'grid' }, svg);
  for (const v of niceTicks(0, t1 - t0 || 1)) {
    if (v > t1 - t0 + 1e-9) continue;
    svgEl('line', { x1: x(t0 + v), x2: x(t0 + v), y1: M.t, y2: axis, class: 'grid' }, svg);
    svgEl('text', { x: x(t0 + v), y: axis + 16, class: 'tick', 'text-anchor': 'middle' }, svg).textContent = `+${fmt(v)} ms`;
  }
  return fig;
}

// Episodes as bars on one time axis, a lane each: [{id, lane, start, end, label, kind, severity}]. An episode
// still going runs to `to`. What a person reads first: when each fault began, how long it lasted, what overlapped.
// Marks [{t, label, id, kind}] are lines across every lane (the fleet's changes).
export function lanes(name, caption, { bars, from, to, marks = [] }) {
  const { fig, svg } = frame(name, caption);
  marks = marks.filter((m) => m.t >= from && m.t <= to);
  if (!bars.length && !marks.length) {
    return empty(fig, svg);
  }
  const names = [...new Set(bars.map((b) => b.lane))];
  const LANE = 16; // units: the page scales a full-width timeline up by about a third
  const h = M.t + 8 + names.length * LANE + M.b;
  svg.setAttribute('viewBox', `0 0 ${W} ${h}`);
  const x = (t) => 200 + (W - 200 - M.r) * ((Math.min(Math.max(t, from), to) - from) / (to - from || 1));
  names.forEach((lane, i) => {
    svgEl('text', { x: 4, y: M.t + i * LANE + 12, class: 'tick' }, svg).textContent = lane.length > 32 ? `${lane.slice(0, 31)}…` : lane;
  });
  for (const b of bars) {
    const yy = M.t + names.indexOf(b.lane) * LANE;
    const end = b.end ?? to;
    const r = svgEl('rect', { x: x(b.start), y: yy + 2, width: Math.max(x(end) - x(b.start), 2), height: LANE - 4,
      class: `episode ${b.kind} ${b.severity || ''}`, 'data-series': b.kind, 'data-id': b.id,
      'data-x': new Date(b.start).toISOString(), 'data-v': (end - b.start) / 6e4 }, svg);
    title(r, `${b.label}: ${utc(b.start)}–${b.end ? utc(b.end).slice(11) : 'now'} UTC`);
  }
  for (const t of timeTicks(from, to)) {
    svgEl('text', { x: x(t), y: h - 8, class: 'tick', 'text-anchor': 'middle' }, svg).textContent = to - from > 864e5 ? utc(t).slice(5) : utc(t).slice(11);
  }
  marks.forEach((m, i) => {
    const g = svgEl('g', { class: `mark ${m.kind || ''}`, 'data-x': new Date(m.t).toISOString(), 'data-label': m.label,
      ...(m.id ? { 'data-id': m.id } : {}) }, svg);
    svgEl('line', { x1: x(m.t), x2: x(m.t), y1: M.t, y2: h - M.b, class: 'mark-line' }, g);
    svgEl('text', { x: x(m.t) + 3, y: h - M.b - 4 - (i % 2) * 12, class: 'mark-text' }, g).textContent = m.label;
    title(g, `${utc(m.t)} UTC: ${m.label}`);
  });
  const items = [{ name: 'incident', color: '#e15759' }, { name: 'alert', color: '#f28e2b' }, { name: 'cluster window', color: '#4e79a7' }];
  legend(fig, marks.length ? [...items, { name: 'change', color: '#6a3d9a', dash: true }] : items);
  return fig;
}
