/* app.js - the cache dashboard (GET /). Hand-written, no library.
 *
 * Polls /stats and /metrics once a second and draws where the cache goes:
 * the layer layout, the budget by kind, one row per live request, bytes
 * against context length, load figures; the planner asks
 * /v1/memory/estimate. Every string from the server reaches the page
 * through textContent or an attribute, never as markup (request ids come
 * from clients). The API key, when the server wants one, lives in this
 * script's memory only: no storage, no cookie.
 */
'use strict';

(function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const POLL_MS = 1000;
  const WINDOW_S = 10;          /* means over this many seconds of samples */

  let apiKey = null;            /* this tab's memory only */
  let paused = false;
  let shown = null;             /* the /stats response the page shows now */
  let estimate = null;          /* the served model's /v1/memory/estimate */
  let estimateShut = false;     /* it answered 401 (stats public, API not): wait for a key */
  let modelKey = '';            /* layout the static parts were drawn for */
  let lastOk = 0;
  let timer = 0;
  let sortKey = 'age';
  let sortDir = -1;             /* 1 ascending, -1 descending */
  const samples = [];           /* {t, gen, ttft, itl} for rates and means */
  const rows = new Map();       /* request id -> its <tr> */

  const $ = (id) => document.getElementById(id);

  /* ------------------------------------------------------------------ */
  /* formatting                                                         */
  /* ------------------------------------------------------------------ */

  function fmtBytes(b) {
    if (b === null || b === undefined || !isFinite(b)) return '\u2013';
    if (b < 1024) return b.toFixed(0) + ' B';
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = b / 1024;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + ' ' + units[i];
  }
  function fmtInt(n) { return Number(n).toLocaleString('en-US'); }
  function fmtSecs(s) {
    if (s === null || !isFinite(s)) return '\u2013';
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + ' ms';
    return s.toFixed(2) + ' s';
  }
  function fmtAge(ms) {
    const s = ms / 1000;
    if (s < 60) return s.toFixed(1) + ' s';
    return Math.floor(s / 60) + ' min ' + String(Math.floor(s % 60)).padStart(2, '0') + ' s';
  }
  function fmtTokens(n) {
    if (n >= 1048576 && n % 1048576 === 0) return n / 1048576 + 'M';
    if (n >= 1024 && n % 1024 === 0) return n / 1024 + 'K';
    return fmtInt(n);
  }
  function setText(id, text) {
    const el = $(id);
    if (el.textContent !== text) el.textContent = text;
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* ------------------------------------------------------------------ */
  /* the API, with the key when the server asks for one                 */
  /* ------------------------------------------------------------------ */

  class AuthNeeded extends Error {}

  async function api(path, opts) {
    const o = Object.assign({ cache: 'no-store' }, opts || {});
    o.headers = Object.assign({}, o.headers || {});
    if (apiKey) o.headers.Authorization = 'Bearer ' + apiKey;
    /* relative: works behind a proxy that serves the page under a prefix */
    const r = await fetch(path, o);
    if (r.status === 401) {
      askKey(apiKey !== null);
      throw new AuthNeeded('401');
    }
    return r;
  }

  function askKey(refused) {
    const box = $('auth');
    const wasHidden = box.hidden;
    box.hidden = false;
    setText('auth-error', refused ? 'The server refused that key.' : '');
    if (wasHidden) $('auth-key').focus();
  }

  $('auth-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const v = $('auth-key').value.trim();
    if (!v) return;
    apiKey = v;
    estimateShut = false;
    $('auth-key').value = '';
    $('auth').hidden = true;
    setText('auth-error', '');
    loadOnce();
    poll();
  });

  /* ------------------------------------------------------------------ */
  /* /metrics: Prometheus text                                          */
  /* ------------------------------------------------------------------ */

  /* name{labels} -> value, for the lines that carry samples; the
   * model_name label every series carries (one model per server) is
   * dropped from the key, so name{le="0.1"} and a bare name match */
  function parseProm(text) {
    const m = new Map();
    for (const line of text.split('\n')) {
      if (!line || line[0] === '#') continue;
      const sp = line.lastIndexOf(' ');
      if (sp < 0) continue;
      const key = line.slice(0, sp).replace(/,?model_name="(?:[^"\\]|\\.)*"/, '').replace('{,', '{').replace('{}', '');
      m.set(key, Number(line.slice(sp + 1)));
    }
    return m;
  }

  /* one histogram: cumulative buckets by upper bound, sum and count */
  function promHist(m, name) {
    const buckets = [];
    const pre = name + '_bucket{le="';
    for (const [k, v] of m) {
      if (!k.startsWith(pre)) continue;
      const le = k.slice(pre.length, k.length - 2);
      buckets.push({ le: le === '+Inf' ? Infinity : Number(le), n: v });
    }
    buckets.sort((a, b) => a.le - b.le);
    return { buckets, sum: m.get(name + '_sum') || 0, count: m.get(name + '_count') || 0 };
  }

  /* Prometheus' histogram_quantile: linear inside the bucket holding q */
  function quantile(h, q) {
    if (!h.count) return null;
    const rank = q * h.count;
    let prevLe = 0;
    let prevN = 0;
    for (const b of h.buckets) {
      if (b.n >= rank) {
        if (b.le === Infinity) return prevLe;
        const inB = b.n - prevN;
        return inB > 0 ? prevLe + (b.le - prevLe) * ((rank - prevN) / inB) : b.le;
      }
      prevLe = b.le;
      prevN = b.n;
    }
    return prevLe;
  }

  /* mean over the samples of the last WINDOW_S seconds, else since start */
  function windowMean(key) {
    const last = samples[samples.length - 1];
    if (!last || !last[key]) return null;
    let first = last;
    for (const s of samples) if (s[key] && last.t - s.t <= WINDOW_S) { first = s; break; }
    const dn = last[key].count - first[key].count;
    if (dn > 0) return (last[key].sum - first[key].sum) / dn;
    return last[key].count ? last[key].sum / last[key].count : null;
  }

  /* ------------------------------------------------------------------ */
  /* model panel and layer strip                                        */
  /* ------------------------------------------------------------------ */

  /* the strip's colour classes (what the layer caches) and each letter's name */
  const KIND_OF_LETTER = { A: 'gqa', M: 'mla', L: 'dnet', S: 'dnet', B: 'dnet', K: 'dnet', C: 'dnet', H: 'gqa', F: 'mlp' };
  const LETTER_NAME = {
    A: 'GQA attention', M: 'MLA', L: 'Gated DeltaNet', S: 'Mamba-2', B: 'Mamba', K: 'Kimi Delta Attention',
    C: 'short convolution', H: 'attention + Mamba-2', F: 'MLP only',
  };

  function drawModel(st) {
    const m = st.model;
    const lay = m.cache_layout || {};
    setText('model-name', m.id);
    document.title = 'hyserve: ' + m.id;
    setText('m-arch', m.arch + ' \u00b7 ' + (lay.kind || ''));
    setText('m-weights', (m.weights_dtype || '') + ' \u00b7 ' + fmtBytes(m.weights_bytes));
    setText('m-ctx', fmtInt(st.limits.max_total_tokens) + ' tokens');
    const kv = (lay.attention && lay.attention.dtype) || (lay.mla && lay.mla.dtype);
    const rec = lay.recurrent && lay.recurrent.dtype;
    setText('m-dtypes', [kv ? 'KV ' + kv : '', rec ? 'state ' + rec : ''].filter(Boolean).join(' \u00b7 ') || '\u2013');
    setText('page-tokens', String(lay.block_tokens || 16));
    setText('m-cache', fmtBytes(lay.bytes_per_token) + '/token + ' + fmtBytes(lay.bytes_per_seq));
    setText('m-mha', fmtBytes(lay.mha_bytes_per_token) + '/token' + (lay.bytes_per_token
      ? ' (' + (lay.mha_bytes_per_token / lay.bytes_per_token).toFixed(1) + '\u00d7)' : ''));

    const letters = m.layers || '';
    const counts = { gqa: 0, mla: 0, dnet: 0, mlp: 0 };
    const byName = new Map();
    const strip = $('strip');
    strip.replaceChildren();
    strip.classList.toggle('dense', letters.length > 48);
    for (let i = 0; i < letters.length; i++) {
      const kind = KIND_OF_LETTER[letters[i]] || 'gqa';
      const name = LETTER_NAME[letters[i]] || 'layer';
      counts[kind]++;
      if (letters[i] === 'H')
        counts.dnet++;                      /* attention and a Mamba-2 state */
      byName.set(name, (byName.get(name) || 0) + 1);
      const li = el('li', 'layer k-' + kind, letters.length > 48 ? '' : String(i));
      li.dataset.kind = kind;
      li.title = 'layer ' + i + ': ' + name;
      li.setAttribute('aria-label', 'layer ' + i + ', ' + name);
      strip.appendChild(li);
    }
    const parts = [];
    for (const [name, n] of byName)
      parts.push(n + ' ' + name);
    setText('m-layers', letters.length + ': ' + parts.join(', '));

    const t = $('reqs');
    t.classList.toggle('no-gqa', !counts.gqa);
    t.classList.toggle('no-mla', !counts.mla);
    t.classList.toggle('no-dnet', !counts.dnet);
  }

  /* ------------------------------------------------------------------ */
  /* budget bar                                                         */
  /* ------------------------------------------------------------------ */

  /* the bar's segments: reserved bytes by kind and what of them is used */
  function budgetParts(st) {
    const tot = st.totals;
    const pc = (st.pools.prefix_cache && st.pools.prefix_cache.enabled) ? st.pools.prefix_cache : {};
    const sp = st.pools.spares || {};
    let gqaUsed = 0;
    let mlaUsed = 0;
    for (const r of st.requests || []) {
      gqaUsed += r.cache_by_kind.gqa_kv.bytes_used;
      mlaUsed += r.cache_by_kind.mla_latent.bytes_used;
    }
    return [
      { kind: 'gqa', name: 'attention KV (GQA)', reserved: tot.gqa_kv_bytes, used: gqaUsed },
      { kind: 'mla', name: 'MLA latent', reserved: tot.mla_latent_bytes, used: mlaUsed },
      { kind: 'dnet', name: 'recurrent state', reserved: tot.recurrent_state_bytes, used: tot.recurrent_state_bytes },
      { kind: 'conv', name: 'conv windows', reserved: tot.recurrent_conv_bytes, used: tot.recurrent_conv_bytes },
      { kind: 'snap', name: 'snapshots (prefix cache, draft rollback)', reserved: tot.checkpoint_bytes || 0, used: tot.checkpoint_bytes || 0 },
      /* what no request owns but the budget holds: the prefix cache's entries
       * (finished requests' KV and states, kept for reuse) and spare blocks */
      { kind: 'prefix', name: 'prefix cache (finished requests, reusable)', reserved: pc.bytes || 0, used: pc.bytes || 0 },
      { kind: 'spare', name: 'spare blocks', reserved: sp.bytes || 0, used: 0 },
      { kind: 'free', name: 'free', reserved: st.pools.free_bytes, used: 0 },
    ];
  }

  /* rows shown only while they hold bytes */
  const OPTIONAL_ROWS = new Set(['snap', 'prefix', 'spare']);
  function segClass(kind) {
    return kind === 'snap' ? 'allattn' : kind;
  }

  function drawBudget(st) {
    const budget = st.pools.budget_bytes;
    const parts = budgetParts(st);
    setText('budget-total', fmtBytes(budget) + ' \u00b7 ' + fmtBytes(st.pools.reserved_bytes) + ' reserved');
    const bar = $('bar');
    if (bar.children.length !== parts.length) {
      bar.replaceChildren();
      for (const p of parts) {
        const s = el('div', 'seg k-' + segClass(p.kind));
        s.dataset.kind = p.kind;
        s.appendChild(el('div', 'used'));
        bar.appendChild(s);
      }
    }
    const body = $('kinds-body');
    if (body.children.length !== parts.length) {
      body.replaceChildren();
      for (const p of parts) {
        const tr = el('tr');
        const name = el('td');
        name.appendChild(el('span', 'sw k-' + segClass(p.kind)));
        name.appendChild(document.createTextNode(p.name));
        tr.append(name, el('td', 'num'), el('td', 'num'), el('td', 'num'));
        body.appendChild(tr);
      }
    }
    const label = [];
    parts.forEach((p, i) => {
      const s = bar.children[i];
      const pct = budget > 0 ? (100 * p.reserved) / budget : 0;
      s.style.width = pct + '%';
      s.dataset.bytes = String(p.reserved);
      s.dataset.used = String(p.used);
      s.title = p.name + ': ' + fmtBytes(p.reserved) + (p.kind === 'free' ? '' : ' reserved, ' + fmtBytes(p.used) + ' used');
      s.firstChild.style.width = p.reserved > 0 ? (100 * p.used) / p.reserved + '%' : '0';
      const cells = body.children[i].children;
      cells[1].textContent = fmtBytes(p.reserved);
      cells[1].dataset.bytes = String(p.reserved);
      cells[2].textContent = p.kind === 'free' ? '' : fmtBytes(p.used);
      cells[3].textContent = pct.toFixed(1) + '%';
      body.children[i].hidden = OPTIONAL_ROWS.has(p.kind) && !p.reserved;
      if (p.reserved) label.push(p.name + ' ' + fmtBytes(p.reserved));
    });
    bar.setAttribute('aria-label', 'cache budget ' + fmtBytes(budget) + ': ' + label.join(', '));
  }

  /* ------------------------------------------------------------------ */
  /* requests table                                                     */
  /* ------------------------------------------------------------------ */

  /* key, header, class, sort value, and the bytes shown (used, reserved) */
  const COLS = [
    { key: 'id', head: 'request id', cls: 'id', w: '11rem', val: (r) => r.id },
    { key: 'state', head: 'state', cls: 'state-c', w: '6.5rem', val: (r) => r.state },
    { key: 'tokens', head: 'tokens', cls: 'num', w: '5rem', val: (r) => r.attn_kv.tokens },
    { key: 'gqa', head: 'GQA KV used / reserved', cls: 'num c-gqa', w: '10.5rem', val: (r) => r.cache_by_kind.gqa_kv.bytes_reserved,
      bytes: (r) => [r.cache_by_kind.gqa_kv.bytes_used, r.cache_by_kind.gqa_kv.bytes_reserved] },
    { key: 'mla', head: 'MLA latent used / reserved', cls: 'num c-mla', w: '10.5rem', val: (r) => r.cache_by_kind.mla_latent.bytes_reserved,
      bytes: (r) => [r.cache_by_kind.mla_latent.bytes_used, r.cache_by_kind.mla_latent.bytes_reserved] },
    { key: 'state_b', head: 'recurrent state', cls: 'num c-state', w: '6.5rem', val: (r) => r.cache_by_kind.recurrent_state_bytes,
      bytes: (r) => [r.cache_by_kind.recurrent_state_bytes] },
    { key: 'conv', head: 'conv state', cls: 'num c-conv', w: '6rem', val: (r) => r.cache_by_kind.recurrent_conv_bytes,
      bytes: (r) => [r.cache_by_kind.recurrent_conv_bytes] },
    { key: 'total', head: 'total reserved', cls: 'num', w: '6.5rem', val: (r) => r.total_bytes_owned,
      bytes: (r) => [r.total_bytes_owned] },
    { key: 'mha', head: 'plain MHA would hold', cls: 'num', w: '7rem', val: (r) => r.mha_equivalent_bytes,
      bytes: (r) => [r.mha_equivalent_bytes] },
    { key: 'age', head: 'age', cls: 'num', w: '5.5rem', val: (r) => r.age_ms },
  ];

  function buildHead() {
    const head = $('req-head');
    const cols = $('req-cols');
    for (const c of COLS) {
      const col = el('col', c.cls.split(' ').filter((x) => x.startsWith('c-')).join(' '));
      col.style.width = c.w;
      cols.appendChild(col);
      const th = el('th', c.cls.replace('id', '').replace('state-c', ''));
      th.scope = 'col';
      th.dataset.key = c.key;
      const b = el('button', '', c.head);
      b.type = 'button';
      b.addEventListener('click', () => {
        if (sortKey === c.key) sortDir = -sortDir;
        else { sortKey = c.key; sortDir = c.key === 'id' || c.key === 'state' ? 1 : -1; }
        markSort();
        if (shown) drawRequests(shown);
      });
      th.appendChild(b);
      head.appendChild(th);
    }
    markSort();
  }

  function markSort() {
    for (const th of $('req-head').children) {
      if (th.dataset.key === sortKey) th.setAttribute('aria-sort', sortDir > 0 ? 'ascending' : 'descending');
      else th.removeAttribute('aria-sort');
    }
  }

  function newRow() {
    const tr = el('tr');
    for (const c of COLS) {
      const td = el('td', c.cls);
      td.dataset.col = c.key;
      if (c.key === 'state') td.appendChild(el('span', 'state'));
      if (c.bytes && c.key !== 'gqa' && c.key !== 'mla') td.dataset.bytes = '';
      if (c.key === 'gqa' || c.key === 'mla') {
        const u = el('span', 'u');
        const r = el('span', 'r');
        td.append(u, r);
      }
      tr.appendChild(td);
    }
    return tr;
  }

  function fillRow(tr, r) {
    tr.dataset.id = r.id;
    COLS.forEach((c, i) => {
      const td = tr.children[i];
      if (c.key === 'id') {
        if (td.textContent !== r.id) { td.textContent = r.id; td.title = r.id; }
      } else if (c.key === 'state') {
        const s = td.firstChild;
        if (s.textContent !== r.state) { s.textContent = r.state; s.className = 'state ' + r.state; }
      } else if (c.key === 'tokens') {
        td.textContent = fmtInt(r.attn_kv.tokens);
        td.title = 'prompt ' + r.prompt_tokens + ' (prefilled ' + r.prefilled_tokens + '), generated ' +
                   r.generated_tokens + ' of at most ' + r.max_new_tokens;
      } else if (c.key === 'age') {
        td.textContent = fmtAge(r.age_ms);
      } else if (c.key === 'gqa' || c.key === 'mla') {
        const [used, reserved] = c.bytes(r);
        td.dataset.used = String(used);
        td.dataset.reserved = String(reserved);
        td.firstChild.textContent = fmtBytes(used);
        td.lastChild.textContent = ' / ' + fmtBytes(reserved);
        td.title = used + ' of ' + reserved + ' bytes';
      } else {
        const b = c.bytes(r)[0];
        td.dataset.bytes = String(b);
        td.textContent = fmtBytes(b);
        td.title = fmtInt(b) + ' bytes';
      }
    });
  }

  function drawRequests(st) {
    const reqs = (st.requests || []).slice();
    const col = COLS.find((c) => c.key === sortKey) || COLS[COLS.length - 1];
    reqs.sort((a, b) => {
      const x = col.val(a);
      const y = col.val(b);
      const d = typeof x === 'string' ? x.localeCompare(y) : x - y;
      return d * sortDir || a.id.localeCompare(b.id);
    });
    const body = $('req-body');
    const live = new Set();
    reqs.forEach((r, i) => {
      live.add(r.id);
      let tr = rows.get(r.id);
      if (!tr) { tr = newRow(); rows.set(r.id, tr); }
      fillRow(tr, r);
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    for (const [id, tr] of rows) {
      if (!live.has(id)) { tr.remove(); rows.delete(id); }
    }
    setText('req-count', reqs.length + ' live');
    $('req-empty').hidden = reqs.length > 0;
  }

  /* ------------------------------------------------------------------ */
  /* bytes against context length                                       */
  /* ------------------------------------------------------------------ */

  /* one sequence's bytes at n tokens: state + whole pages, as reserved */
  function seriesOf(st, est) {
    const lay = st.model.cache_layout;
    const perTok = est.per_token.total_bytes;
    const perSeq = est.per_sequence.recurrent_state_bytes;
    const page = lay.block_tokens || 16;
    const cf = est.counterfactual;
    const s = [
      { key: 'model', name: 'this model', f: (n) => perSeq + Math.ceil(n / page) * page * perTok,
        per: fmtBytes(perTok) + '/token + ' + fmtBytes(perSeq) },
      { key: 'allattn', name: 'every layer attention', f: (n) => n * cf.all_attention_bytes_per_token,
        per: fmtBytes(cf.all_attention_bytes_per_token) + '/token' },
      { key: 'mha', name: 'plain MHA', f: (n) => n * cf.mha_bytes_per_token, per: fmtBytes(cf.mha_bytes_per_token) + '/token' },
    ];
    if (cf.gqa_all_layers_bytes_per_token)
      s.push({ key: 'gqa', name: 'GQA on every layer', f: (n) => n * cf.gqa_all_layers_bytes_per_token,
               per: fmtBytes(cf.gqa_all_layers_bytes_per_token) + '/token' });
    if (cf.mla_all_layers_bytes_per_token)
      s.push({ key: 'mla', name: 'MLA on every layer', f: (n) => n * cf.mla_all_layers_bytes_per_token,
               per: fmtBytes(cf.mla_all_layers_bytes_per_token) + '/token' });
    return s;
  }

  /* the drawing's size follows its box, so labels keep their size on a phone */
  const CH = { w: 640, h: 340, l: 64, r: 14, t: 12, b: 40 };
  function sizeChart() {
    const box = $('chart').parentElement.clientWidth - 2;
    CH.w = Math.max(300, Math.min(900, Math.round(box)));
    CH.h = CH.w < 500 ? 260 : 340;
    $('chart').setAttribute('viewBox', `0 0 ${CH.w} ${CH.h}`);
  }

  function niceStep(max, n) {
    const raw = max / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function niceBytesStep(max, n) {
    /* steps of 1, 2, 5 x a power of 1024's unit, so ticks read well */
    const unit = Math.pow(1024, Math.max(0, Math.floor(Math.log(Math.max(max, 1)) / Math.log(1024))));
    return niceStep(max / unit, n) * unit;
  }

  function drawChartFrame(st, est) {
    const g = $('chart');
    sizeChart();
    for (const n of Array.from(g.childNodes)) if (n.nodeName !== 'desc') n.remove();
    const ctx = st.limits.max_total_tokens;
    const series = seriesOf(st, est);
    const yMax = Math.max(1, ...series.map((s) => s.f(ctx)));
    const X = (n) => CH.l + ((CH.w - CH.l - CH.r) * n) / ctx;
    const Y = (b) => CH.h - CH.b - ((CH.h - CH.t - CH.b) * b) / yMax;
    const ys = niceBytesStep(yMax, 5);
    for (let b = 0; b <= yMax * 1.0001; b += ys) {
      g.appendChild(svg('line', { class: b ? 'grid-line' : 'axis', x1: CH.l, x2: CH.w - CH.r, y1: Y(b), y2: Y(b) }));
      g.appendChild(svg('text', { x: CH.l - 6, y: Y(b) + 4, 'text-anchor': 'end' }, fmtBytes(b)));
    }
    const xs = niceStep(ctx, CH.w < 500 ? 3 : 5);
    for (let n = 0; n <= ctx; n += xs) {
      g.appendChild(svg('line', { class: n ? 'grid-line' : 'axis', x1: X(n), x2: X(n), y1: CH.t, y2: CH.h - CH.b }));
      g.appendChild(svg('text', { x: X(n), y: CH.h - CH.b + 16, 'text-anchor': 'middle' }, fmtTokens(n)));
    }
    g.appendChild(svg('text', { x: (CH.l + CH.w - CH.r) / 2, y: CH.h - 4, 'text-anchor': 'middle' }, 'context length (tokens)'));
    /* draw the model's line last so it sits on top */
    const legend = $('chart-legend');
    legend.replaceChildren();
    const ordered = series.slice(1).concat(series.slice(0, 1));
    for (const s of ordered) {
      const pts = [];
      const steps = 160;
      for (let i = 0; i <= steps; i++) {
        const n = Math.round((ctx * i) / steps);
        pts.push(X(n).toFixed(1) + ',' + Y(s.f(n)).toFixed(1));
      }
      const path = svg('polyline', { class: 's s-' + s.key, points: pts.join(' ') });
      path.dataset.series = s.key;
      g.appendChild(path);
    }
    for (const s of series) {
      const li = el('li');
      li.dataset.series = s.key;
      const sw = el('span', 'sw line k-' + s.key);
      if (s.key === 'gqa' || s.key === 'mla' || s.key === 'allattn') {
        sw.className = 'sw line dashed';
        sw.style.borderColor = getComputedStyle(document.documentElement).getPropertyValue('--' + s.key);
      }
      li.append(sw, document.createTextNode(s.name + ': ' + s.per + ' \u00b7 ' + fmtBytes(s.f(ctx)) + ' at ' + fmtTokens(ctx)));
      legend.appendChild(li);
    }
    const li = el('li');
    li.append(el('span', 'sw dot'), document.createTextNode('a request: held now; '),
              el('span', 'sw ring'), document.createTextNode('its reservation (prompt + max new tokens)'));
    legend.appendChild(li);
    const marks = svg('g', { id: 'chart-marks' });
    g.appendChild(marks);
    g.dataset.ymax = String(yMax);
  }

  function drawMarks(st) {
    const g = $('chart-marks');
    if (!g) return;
    const ctx = st.limits.max_total_tokens;
    const yMax = Number($('chart').dataset.ymax);
    const X = (n) => CH.l + ((CH.w - CH.l - CH.r) * n) / ctx;
    const Y = (b) => CH.h - CH.b - ((CH.h - CH.t - CH.b) * b) / yMax;
    const reqs = st.requests || [];
    while (g.children.length > reqs.length) g.lastChild.remove();
    while (g.children.length < reqs.length) {
      const m = svg('g', { class: 'req' });
      m.append(svg('line', { class: 'reach' }), svg('circle', { class: 'res', r: 3.5 }),
               svg('circle', { class: 'mark', r: 4.5 }), svg('title', {}));
      g.appendChild(m);
    }
    reqs.forEach((r, i) => {
      /* a dot where the request is (tokens held, bytes used), a ring where
       * its reservation reaches (tokens reserved, bytes reserved) */
      const k = r.cache_by_kind;
      const used = k.gqa_kv.bytes_used + k.mla_latent.bytes_used + k.recurrent_state_bytes + k.recurrent_conv_bytes;
      const m = g.children[i];
      const [line, ring, dot, title] = m.children;
      const x0 = X(r.attn_kv.tokens).toFixed(1);
      const y0 = Y(used).toFixed(1);
      const x1 = X(r.attn_kv.tokens_reserved).toFixed(1);
      const y1 = Y(r.total_bytes_owned).toFixed(1);
      line.setAttribute('x1', x0); line.setAttribute('y1', y0);
      line.setAttribute('x2', x1); line.setAttribute('y2', y1);
      ring.setAttribute('cx', x1); ring.setAttribute('cy', y1);
      dot.setAttribute('cx', x0); dot.setAttribute('cy', y0);
      m.dataset.id = r.id;
      title.textContent = r.id + ': ' + fmtInt(r.attn_kv.tokens) + ' tokens, ' + fmtBytes(used) + ' used; ' +
        fmtInt(r.attn_kv.tokens_reserved) + ' reserved, ' + fmtBytes(r.total_bytes_owned);
    });
  }

  /* ------------------------------------------------------------------ */
  /* load figures                                                       */
  /* ------------------------------------------------------------------ */

  function drawLoad(st, prom) {
    const now = performance.now() / 1000;
    const s = { t: now, gen: st.scheduler.generation_tokens_total };
    if (prom) {
      s.ttft = promHist(prom, 'hyserve_time_to_first_token_seconds');
      s.itl = promHist(prom, 'hyserve_inter_token_latency_seconds');
    }
    samples.push(s);
    while (samples.length > 2 && now - samples[0].t > 60) samples.shift();
    setText('k-running', String(st.scheduler.running));
    setText('k-waiting', String(st.scheduler.waiting));
    setText('k-batch', String(st.scheduler.batch_size_last));
    /* speculative decoding: accepted / verified draft tokens since start */
    const sp = st.speculative;
    setText('k-spec', sp && sp.draft_tokens_total
      ? (100 * sp.acceptance_rate).toFixed(0) + '% of ' + sp.draft_tokens_total : '\u2013');
    let first = samples[0];
    for (const x of samples) if (now - x.t <= WINDOW_S / 2) { first = x; break; }
    const dt = now - first.t;
    setText('k-tps', dt > 0.5 ? ((s.gen - first.gen) / dt).toFixed(1) : '\u2013');
    if (s.ttft) {
      setText('k-ttft', fmtSecs(windowMean('ttft')));
      setText('k-ttft95', fmtSecs(quantile(s.ttft, 0.95)));
      setText('k-itl', fmtSecs(windowMean('itl')));
      setText('k-itl95', fmtSecs(quantile(s.itl, 0.95)));
    }
  }

  /* ------------------------------------------------------------------ */
  /* polling                                                            */
  /* ------------------------------------------------------------------ */

  function status(text, bad) {
    const c = $('conn');
    c.classList.toggle('bad', !!bad);
    setText('conn', text);
  }

  async function loadEstimate() {
    const r = await api('v1/memory/estimate', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
    if (r.ok) estimate = await r.json();
  }

  async function tick() {
    const [rs, rm] = await Promise.all([api('stats'), api('metrics').catch((e) => e)]);
    if (!rs.ok) throw new Error('/stats answered ' + rs.status);
    const st = await rs.json();
    let prom = null;
    if (rm instanceof Response && rm.ok) prom = parseProm(await rm.text());
    if (paused) return;
    const key = st.model.id + '|' + st.model.layers + '|' + st.limits.max_total_tokens;
    if (key !== modelKey || !estimate) {
      drawModel(st);
      if (!estimate && !estimateShut) {
        try { await loadEstimate(); } catch (e) { if (e instanceof AuthNeeded) estimateShut = true; else throw e; }
      }
      if (estimate) drawChartFrame(st, estimate);
      modelKey = estimate ? key : '';
      fillPlannerDefaults(st);
    }
    drawBudget(st);
    drawRequests(st);
    drawMarks(st);
    drawLoad(st, prom);
    shown = st;
    lastOk = Date.now();
    status('live');
  }

  async function poll() {
    clearTimeout(timer);
    try {
      await tick();
    } catch (e) {
      if (e instanceof AuthNeeded) { status('needs a key', true); return; }
      status(lastOk ? 'no answer: retrying' : 'cannot reach the server', true);
    }
    if (!paused) timer = setTimeout(poll, POLL_MS);
  }

  $('pause').addEventListener('click', () => {
    paused = !paused;
    $('pause').setAttribute('aria-pressed', String(paused));
    $('pause').textContent = paused ? 'Resume' : 'Pause';
    if (paused) { clearTimeout(timer); status('paused'); } else poll();
  });

  /* ------------------------------------------------------------------ */
  /* planner                                                            */
  /* ------------------------------------------------------------------ */

  let plannerFilled = false;
  function fillPlannerDefaults(st) {
    if (plannerFilled) return;
    plannerFilled = true;
    $('p-ctx').value = String(st.limits.max_total_tokens);
    $('p-budget').value = sizeText(st.pools.budget_bytes);
    $('plan-form').requestSubmit();
  }

  /* bytes as the size the server parses: "48M", "2G", or plain bytes */
  function sizeText(b) {
    for (const [unit, n] of [['T', 2 ** 40], ['G', 2 ** 30], ['M', 2 ** 20], ['K', 2 ** 10]])
      if (b >= n && b % n === 0) return b / n + unit;
    return String(b);
  }

  async function loadPresets() {
    const r = await api('v1/memory/presets');
    if (!r.ok) return;
    const j = await r.json();
    const sel = $('p-model');
    while (sel.options.length > 1) sel.remove(1);
    for (const name of j.presets || []) {
      const o = el('option', '', name);
      o.value = name;
      sel.appendChild(o);
    }
  }

  function planRow(dl, name, value) {
    dl.append(el('dt', '', name), el('dd', '', value));
  }

  $('plan-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = {};
    if ($('p-model').value) body.preset = $('p-model').value;
    const ctx = Number($('p-ctx').value);
    const batch = Number($('p-batch').value);
    if (ctx) body.context = ctx;
    if (batch) body.batch = batch;
    const b = $('p-budget').value.trim();
    if (b) body.budget = /^[0-9]+$/.test(b) ? Number(b) : b;
    if ($('p-kv').value) body.kv_dtype = $('p-kv').value;
    if ($('p-state').value) body.state_dtype = $('p-state').value;
    const out = $('plan-out');
    setText('plan-error', '');
    try {
      const r = await api('v1/memory/estimate', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      const j = await r.json();
      out.replaceChildren();
      if (!r.ok) { setText('plan-error', (j && (j.error && j.error.message || j.error)) || 'error ' + r.status); return; }
      const t = j.total || {};
      const cf = j.counterfactual || {};
      out.dataset.perSequence = String(t.bytes_reserved_per_sequence);
      planRow(out, 'layout', j.layout.name + ' \u00b7 ' + j.layout.layers + ' layers');
      planRow(out, 'per token', fmtBytes(j.per_token.total_bytes));
      planRow(out, 'state per sequence', fmtBytes(j.per_sequence.recurrent_state_bytes));
      planRow(out, 'one sequence of ' + fmtInt(t.context) + ' tokens', fmtBytes(t.bytes_reserved_per_sequence));
      planRow(out, fmtInt(t.batch) + ' such sequences', fmtBytes(t.bytes_reserved));
      planRow(out, 'plain MHA, same', fmtBytes(t.mha_kv_bytes));
      if (cf.mha_over_actual) planRow(out, 'MHA / this layout', cf.mha_over_actual.toFixed(1) + '\u00d7 per token');
      if (j.fits) {
        planRow(out, 'sequences that fit ' + fmtBytes(j.fits.budget_bytes), fmtInt(j.fits.max_batch_at_context));
        planRow(out, 'longest context for ' + fmtInt(t.batch), fmtInt(j.fits.max_context_at_batch) + ' tokens');
      }
    } catch (e) {
      if (!(e instanceof AuthNeeded)) setText('plan-error', 'the server did not answer');
    }
  });

  /* ------------------------------------------------------------------ */

  function loadOnce() {
    loadPresets().catch(() => {});
  }

  /* a new width redraws the chart (after the resizing settles) */
  let resizeTimer = 0;
  let drawnWidth = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      const w = $('chart').parentElement.clientWidth;
      if (!shown || !estimate || w === drawnWidth) return;
      drawnWidth = w;
      drawChartFrame(shown, estimate);
      drawMarks(shown);
    }, 150);
  });

  /* for the browser test and the curious: the /stats response on screen */
  window.hyserveDash = Object.freeze({
    shown: () => shown,
    fmtBytes,
    paused: () => paused,
  });

  buildHead();
  loadOnce();
  poll();
})();
