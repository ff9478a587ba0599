/* The model graph of the torq-gen-config HTML report (torq_gen_config/report/graph.py makes
   its data, #graph-data). Layers are nodes, tensors edges; scopes from the ONNX node names
   collapse into one node each; dagre (inlined before this script) lays out what is visible.
   Colour: the worst verdict of a layer (of a scope: of its members) or the recommended
   executor (of a scope: the one most members have). No network, no other library. */
(function () {
  'use strict';
  var dataEl = document.getElementById('graph-data');
  if (!dataEl) return;
  var G = JSON.parse(dataEl.textContent);
  if (G.unavailable) return;
  var cellsEl = document.getElementById('cell-details');
  var cells = cellsEl ? JSON.parse(cellsEl.textContent) : {};
  var NS = 'http://www.w3.org/2000/svg';
  var box = document.getElementById('graph-box'), svg = document.getElementById('graph-svg');
  var vp = document.getElementById('graph-viewport'), panel = document.getElementById('graph-detail');
  var nodes = G.nodes, rank = {}, size = {}, expanded = {}, mode = 'worst', selected = null;
  var view = {x: 0, y: 0, k: 1}, laid = null, shown = {}, searchAt = -1, lastQuery = null;
  G.status_rank.forEach(function (s, i) { rank[s] = i; });
  nodes.forEach(function (n, i) {
    n.index = i;
    for (var d = 1; d <= n.scope.length; d++) { var p = n.scope.slice(0, d).join('/'); size[p] = (size[p] || 0) + 1; }
  });

  function esc(s) { return String(s).replace(/[&<>"]/g, function (c) { return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]; }); }
  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function worst(list) { return list.reduce(function (a, b) { return (rank[b] || 0) > (rank[a] || 0) ? b : a; }, 'success'); }
  function majority(recs) {
    var c = {}, best = null, order = G.executors.concat([null]);
    recs.forEach(function (r) { c[r] = (c[r] || 0) + 1; });
    order.forEach(function (r) { if ((c[r] || 0) > (c[best] || 0)) best = r; });
    return best;
  }
  function setLevel(level) {  // level null: everything expanded
    expanded = {};
    Object.keys(size).forEach(function (p) { if (level === null || p.split('/').length <= level) expanded[p] = true; });
    box.setAttribute('data-level', level === null ? 'all' : String(level));
  }
  function rep(n) {  // the visible node a layer is drawn as
    for (var d = 1; d <= n.scope.length; d++) {
      var p = n.scope.slice(0, d).join('/');
      if (!expanded[p] && size[p] > 1) return 's:' + p;
    }
    return 'n:' + n.index;
  }
  function groups() {
    var out = {}, order = [];
    nodes.forEach(function (n) {
      var r = rep(n);
      if (!out[r]) { out[r] = {id: r, members: []}; order.push(r); }
      out[r].members.push(n);
    });
    return order.map(function (r) { return out[r]; });
  }
  function fill(g) {
    if (mode === 'rec') {
      var r = g.members.length === 1 ? g.members[0].rec : majority(g.members.map(function (m) { return m.rec; }));
      return r ? G.executor_colors[r] || G.none_color : G.none_color;
    }
    return G.status_colors[worst(g.members.map(function (m) { return m.worst; }))];
  }
  function ink(hex) {  // dark text on light fills
    var v = parseInt(hex.slice(1), 16), r = v >> 16, g = (v >> 8) & 255, b = v & 255;
    return (0.299 * r + 0.587 * g + 0.114 * b) > 150 ? '#212121' : '#ffffff';
  }
  function flagCounts(g) {
    var c = {};
    g.members.forEach(function (m) { m.flags.forEach(function (f) { c[f] = (c[f] || 0) + 1; }); });
    return c;
  }
  function cut(s, n) { s = String(s); return s.length > n ? s.slice(0, n - 1) + '\u2026' : s; }

  function layout() {
    var t0 = performance.now(), gs = groups(), g = new dagre.graphlib.Graph();
    g.setGraph({rankdir: 'TB', nodesep: 18, ranksep: 36, marginx: 20, marginy: 20});
    g.setDefaultEdgeLabel(function () { return {}; });
    shown = {};
    gs.forEach(function (grp) {
      grp.scope = grp.id.charAt(0) === 's';
      shown[grp.id] = grp;
      g.setNode(grp.id, {width: grp.scope ? 190 : 160, height: grp.scope ? 44 : 36});
    });
    var tensors = {};
    G.edges.forEach(function (e) {
      var a = rep(nodes[e[0]]), b = rep(nodes[e[1]]);
      if (a === b) return;
      var k = a + '\u0000' + b;
      if (!tensors[k]) { tensors[k] = []; g.setEdge(a, b); }
      tensors[k].push(e[2]);
    });
    dagre.layout(g);
    laid = {graph: g, tensors: tensors};
    draw();
    box.setAttribute('data-visible', String(gs.length));
    box.setAttribute('data-layout-ms', String(Math.round(performance.now() - t0)));
  }

  function draw() {
    var g = laid.graph;
    while (vp.firstChild) vp.removeChild(vp.firstChild);
    var edges = el('g', {'class': 'gedges'}, vp);
    g.edges().forEach(function (e) {
      var pts = g.edge(e).points, d = 'M' + pts.map(function (p) { return p.x.toFixed(1) + ' ' + p.y.toFixed(1); }).join('L');
      var path = el('path', {d: d, 'class': 'gedge', 'marker-end': 'url(#graph-arrow)'}, edges);
      var t = laid.tensors[e.v + '\u0000' + e.w];
      el('title', {}, path).textContent = t.slice(0, 5).join(', ') + (t.length > 5 ? ' (+' + (t.length - 5) + ')' : '');
    });
    var layer = el('g', {'class': 'gnodes'}, vp);
    g.nodes().forEach(function (id) {
      var nd = g.node(id), grp = shown[id], w = nd.width, h = nd.height, c = fill(grp), fc = flagCounts(grp);
      var gn = el('g', {'class': 'gnode' + (grp.scope ? ' gscope' : ''), 'data-id': id,
                        transform: 'translate(' + (nd.x - w / 2) + ',' + (nd.y - h / 2) + ')'}, layer);
      if (grp.scope) el('rect', {x: 4, y: 4, width: w, height: h, rx: 5, 'class': 'gstack'}, gn);
      // a critical failure: a black double ring outside the node (and outside the selection
      // ring, drawn on the body), plus a "!" badge, so it shows on a red error node too
      if (fc.critical) {
        el('rect', {x: -7, y: -7, width: w + 14, height: h + 14, rx: 9, 'class': 'gcritical-ring'}, gn);
        el('rect', {x: -4, y: -4, width: w + 8, height: h + 8, rx: 7, 'class': 'gcritical-ring gcritical-inner'}, gn);
      }
      var cls = 'gbody' + (fc.critical ? ' gcritical' : '') +
        (G.blind_flags.some(function (f) { return fc[f]; }) ? ' gblind' : '') + (id === selected ? ' gselected' : '');
      el('rect', {width: w, height: h, rx: 5, fill: c, 'class': cls}, gn);
      var m = grp.members[0], line1, line2;
      if (grp.scope) {
        line1 = cut(id.slice(2).split('/').pop(), 24) + ' (' + grp.members.length + ' layers)';
        line2 = cut('/' + id.slice(2), 30);
      } else {
        line1 = m.op;
        var parts = m.name ? m.name.split('/').filter(Boolean) : [];
        line2 = parts.length ? parts.slice(-2).join('/') : m.id;
        if (line2.length > 26) line2 = '\u2026' + line2.slice(-25);
      }
      el('text', {x: w / 2, y: h / 2 - 3, fill: ink(c), 'class': 'gl1'}, gn).textContent = line1;
      el('text', {x: w / 2, y: h / 2 + 11, fill: ink(c), 'class': 'gl2'}, gn).textContent = line2;
      var badges = [];
      if (fc.critical) badges.push(['!', 'gbadge-critical']);
      if (fc.dispute) badges.push(['\u26a0', 'gbadge-dispute']);
      if (fc['success*']) badges.push(['*', 'gbadge-star']);
      badges.forEach(function (b, i) {
        var bx = w - 8 - i * 16;
        el('circle', {cx: bx, cy: 0, r: 7, 'class': b[1]}, gn);
        el('text', {x: bx, y: 4, 'class': 'gbadge-text'}, gn).textContent = b[0];
      });
      var tip = grp.scope ? '/' + id.slice(2) + ': ' + grp.members.length + ' layers (click to expand)'
        : m.id + ' (' + m.op + ')' + (m.rec ? ', recommended ' + m.rec : ', no recommendation') + ', worst ' + m.worst;
      var fl = Object.keys(fc).map(function (f) { return grp.scope ? f + ' ' + fc[f] : f; });
      el('title', {}, gn).textContent = tip + (fl.length ? '\n' + fl.join(', ') : '');
    });
    apply();
  }

  function apply() { vp.setAttribute('transform', 'translate(' + view.x + ',' + view.y + ') scale(' + view.k + ')'); }
  function fit(readable) {  // the whole graph; readable: not below 0.6 (the top of a long graph)
    var gg = laid.graph.graph(), W = svg.clientWidth, H = svg.clientHeight;
    view.k = Math.max(readable ? 0.6 : 0.03, Math.min(1.2, W / (gg.width || 1), H / (gg.height || 1)));
    view.x = (W - (gg.width || 0) * view.k) / 2;
    if (view.x < 0) view.x = 10;
    view.y = 10;
    apply();
  }
  function centre(id) {
    var nd = laid.graph.node(id);
    if (!nd) return;
    view.k = Math.max(view.k, 0.8);
    view.x = svg.clientWidth / 2 - nd.x * view.k;
    view.y = svg.clientHeight / 2 - nd.y * view.k;
    apply();
  }

  function pill(s) { return '<span class="status-pill" style="background:' + G.status_colors[s] + ';color:' + ink(G.status_colors[s]) + '">' + esc(s) + '</span>'; }
  function fmt(x) { return x === null || x === undefined ? 'n/a' : (typeof x === 'number' ? Number(x.toPrecision(3)) : x); }
  function showLayer(n) {
    var h = '<b>' + esc(n.id) + '</b> (' + esc(n.op) + ')';
    if (n.name) h += '<br>node: <code>' + esc(n.name) + '</code>';
    h += '<br>recommended: <b>' + esc(n.rec || 'none') + '</b>; worst verdict ' + pill(n.worst);
    if (n.flags.length) h += '<br>marks: ' + n.flags.map(function (f) { return '<span class="gflag">' + esc(f) + '</span>'; }).join(' ');
    G.executors.forEach(function (ex, col) {
      var d = cells[n.row + '|' + col] || {}, m = d.metrics || {}, t = d.timing_ms || {};
      h += '<div class="gexec"><b>' + esc(ex) + '</b>' + (n.rec === ex ? ' &#9733;' : '') + ' ' + pill(n.verdicts[ex]);
      if (m.max_rel_diff !== undefined && m.max_rel_diff !== null) {
        h += '<br>max rel ' + fmt(m.max_rel_diff) + ', mean rel ' + fmt(m.mean_rel_diff) + ', max abs ' +
          fmt(m.max_abs_diff) + ', cosine ' + fmt(m.cosine_similarity);
      }
      if (t.compile !== null && t.compile !== undefined) {
        h += '<br>compile ' + fmt(t.compile) + ' ms, run ' + fmt(t.run) + ' ms' +
          (t.runtime_median !== null && t.runtime_median !== undefined ? ', runtime median ' + fmt(t.runtime_median) + ' ms' : '');
      }
      if (d.stage || d.summary) h += '<br>' + esc((d.stage ? '[' + d.stage + '] ' : '') + (d.summary || ''));
      if (d.inconclusive_reasons && d.inconclusive_reasons.length) h += '<br>inconclusive: ' + esc(d.inconclusive_reasons[0]);
      if (d.message) h += '<details><summary>message</summary><pre>' + esc(d.message) + '</pre></details>';
      h += '</div>';
    });
    ['reference_dispute', 'reference_fallback', 'duplicate_of', 'not_testable_reason', 'skipped_reason'].forEach(function (k) {
      for (var c = 0; c < G.executors.length; c++) {
        var v = (cells[n.row + '|' + c] || {})[k];
        if (v) { h += k.replace(/_/g, ' ') + ': ' + esc(v) + '<br>'; break; }
      }
    });
    if (n.full) {
      var f = n.full;  // stale: the layer's assignment changed since that run (graph.py, as `view` says it)
      h += (f.stale ? '<span class="gstale">full-model run (out of date: ' + esc(f.stale_reason || 'assignment changed since') +
            '; that run: ' + esc(f.run_status || '?') + ')</span>'
            : 'full-model run (' + esc(f.run_status || '?') + ')') + ': on <b>' + esc(f.executor || '?') + '</b>' +
        (f.partition !== undefined ? ', partition ' + esc(f.partition) + ' (' + esc(f.pid) + ')' : '') +
        (f.check ? ', partition check ' + esc(f.check) + (f.check_summary ? ': ' + esc(f.check_summary) : '') : '') + '<br>';
      if (f.placement) {  // one-module run: where its dispatches ran, read back from the compiled program
        h += 'placement (read back): ' + (f.placement === 'elsewhere' ? '<span class="gstale">RAN ELSEWHERE</span> ' : '') +
          esc(f.placement) + (f.ran_on && f.ran_on.length ? ', ran on <b>' + esc(f.ran_on.join(', ')) + '</b>' : '') + '<br>';
      }
    } else if (G.full_model) {
      h += 'full-model run: not placed<br>';
    }
    for (var dd = n.scope.length; dd >= 1; dd--) {
      var p = n.scope.slice(0, dd).join('/');
      if (size[p] > 1) h += '<button class="gcollapse" data-scope="' + esc(p) + '">collapse /' + esc(p) + '</button> ';
    }
    panel.innerHTML = h;
  }
  function showScope(grp, hidden) {  // hidden: the selected layer that this (collapsed) scope now holds
    var c = {}, fc = flagCounts(grp), ops = {};
    grp.members.forEach(function (m) { c[m.worst] = (c[m.worst] || 0) + 1; ops[m.op] = (ops[m.op] || 0) + 1; });
    panel.innerHTML = (hidden ? 'the selected layer <b>' + esc(hidden.id) + '</b> is now inside the collapsed scope:<br>' : '') +
      '<b>/' + esc(grp.id.slice(2)) + '</b>: ' + grp.members.length + ' layers (' +
      (hidden ? 'collapsed: click it on the graph to expand' : 'expanded on the graph') + ')<br>worst verdicts: ' +
      Object.keys(c).map(function (s) { return pill(s) + ' ' + c[s]; }).join(' ') + '<br>op types: ' +
      esc(Object.keys(ops).map(function (o) { return o + ' ' + ops[o]; }).join(', ')) +
      (Object.keys(fc).length ? '<br>marks: ' + esc(Object.keys(fc).map(function (f) { return f + ' ' + fc[f]; }).join(', ')) : '');
  }
  function select(id) {
    selected = id;
    box.setAttribute('data-selected', id || '');
    var grp = shown[id];
    if (grp && !grp.scope) showLayer(grp.members[0]);
  }
  function expandTo(n) {
    for (var d = 1; d <= n.scope.length; d++) expanded[n.scope.slice(0, d).join('/')] = true;
  }
  function search(q) {
    q = String(q || '').trim().toLowerCase();
    var out = document.getElementById('graph-search-result');
    if (!q) { out.textContent = ''; return null; }
    var hits = nodes.filter(function (n) {
      return n.id.toLowerCase().indexOf(q) >= 0 || n.name.toLowerCase().indexOf(q) >= 0 || n.op.toLowerCase() === q;
    });
    if (!hits.length) { out.textContent = 'no layer matches'; return null; }
    searchAt = q === lastQuery ? (searchAt + 1) % hits.length : 0;
    lastQuery = q;
    var n = hits[searchAt];
    expandTo(n);
    selected = 'n:' + n.index;
    layout();
    select(selected);
    centre(selected);
    out.textContent = (searchAt + 1) + ' of ' + hits.length + ': ' + n.id;
    return n.id;
  }
  function legend() {
    var items = mode === 'rec'
      ? G.executors.map(function (e) { return [G.executor_colors[e], e]; }).concat([[G.none_color, 'no recommendation']])
      : G.status_rank.map(function (s) { return [G.status_colors[s], s]; });
    document.getElementById('graph-legend').innerHTML = items.map(function (it) {
      return '<span class="swatch" style="background:' + it[0] + '"></span>' + esc(it[1]);
    }).join(' &nbsp; ') + ' &nbsp;|&nbsp; <span class="gkey gkey-critical"></span><b class="gbadge-key gbadge-key-critical">!</b> critical failure (every executor failed) ' +
      '<span class="gkey gkey-blind"></span>blind spot (unverified, onnx reference, not testable, generated inputs, reference repeats) ' +
      '<b class="gbadge-key">\u26a0</b> reference dispute <b class="gbadge-key">*</b> success* &nbsp; stacked box: a collapsed scope';
  }
  function setMode(m) {
    mode = m;
    box.setAttribute('data-mode', m);
    legend();
    if (laid) draw();
  }

  // events: click (select / expand), drag to pan, wheel to zoom
  var drag = null;
  svg.addEventListener('mousedown', function (ev) { drag = {x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false}; });
  window.addEventListener('mousemove', function (ev) {
    if (!drag) return;
    var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
    if (drag.moved) { view.x = drag.vx + dx; view.y = drag.vy + dy; apply(); }
  });
  window.addEventListener('mouseup', function () { setTimeout(function () { drag = null; }, 0); });
  svg.addEventListener('click', function (ev) {
    if (drag && drag.moved) return;
    var gn = ev.target.closest ? ev.target.closest('.gnode') : null;
    if (!gn) return;
    var id = gn.getAttribute('data-id'), grp = shown[id];
    if (grp.scope) {
      expanded[id.slice(2)] = true;
      layout();
      showScope(grp);
      centre(rep(grp.members[0]));
      return;
    }
    select(id);
    draw();
  });
  svg.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    var r = svg.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
    var k = Math.min(4, Math.max(0.03, view.k * Math.exp(-ev.deltaY * 0.0015)));
    view.x = px - (px - view.x) * k / view.k;
    view.y = py - (py - view.y) * k / view.k;
    view.k = k;
    apply();
  }, {passive: false});
  function followSelection() {  // after scopes collapsed: a selected layer now hidden shows as its scope
    if (!selected || shown[selected]) return;
    var n = selected.charAt(0) === 'n' ? nodes[parseInt(selected.slice(2), 10)] : null;
    var r = n ? rep(n) : null;
    selected = null;
    box.setAttribute('data-selected', '');
    if (r && shown[r] && shown[r].scope) {
      showScope(shown[r], n);
    } else {
      panel.innerHTML = 'click a layer for its verdicts, metrics and errors';
    }
    draw();
  }
  panel.addEventListener('click', function (ev) {
    var p = ev.target.getAttribute && ev.target.getAttribute('data-scope');
    if (!p) return;
    delete expanded[p];
    Object.keys(expanded).forEach(function (q) { if (q.indexOf(p + '/') === 0) delete expanded[q]; });
    layout();
    followSelection();
    centre('s:' + p);
  });
  function zoom(f) { view.k *= f; apply(); }
  document.getElementById('graph-fit').onclick = function () { fit(false); };
  document.getElementById('graph-zoom-in').onclick = function () { zoom(1.25); };
  document.getElementById('graph-zoom-out').onclick = function () { zoom(0.8); };
  document.getElementById('graph-search').addEventListener('keydown', function (ev) { if (ev.key === 'Enter') search(this.value); });
  document.getElementById('graph-search-go').onclick = function () { search(document.getElementById('graph-search').value); };
  Array.prototype.forEach.call(document.querySelectorAll('input[name="graph-color"]'), function (r) {
    r.addEventListener('change', function () { if (r.checked) setMode(r.value); });
  });
  var levelSel = document.getElementById('graph-level');
  for (var lv = 0; lv < G.depth; lv++) {
    var o = document.createElement('option');
    o.value = String(lv);
    o.textContent = lv === 0 ? 'top-level scopes collapsed' : 'scopes below depth ' + lv + ' collapsed';
    levelSel.appendChild(o);
  }
  var all = document.createElement('option');
  all.value = 'all';
  all.textContent = 'everything expanded (' + nodes.length + ' layers)';
  levelSel.appendChild(all);
  levelSel.value = G.level === null ? 'all' : String(G.level);
  levelSel.addEventListener('change', function () {
    setLevel(levelSel.value === 'all' ? null : parseInt(levelSel.value, 10));
    layout();
    followSelection();
    fit(true);
  });

  setLevel(G.level);
  setMode('worst');
  layout();
  fit(true);
  box.setAttribute('data-done-ms', String(Math.round(performance.now())));
  window.torqGraph = {
    search: search, setMode: setMode, fit: fit,
    setLevel: function (l) { setLevel(l); layout(); followSelection(); fit(true); levelSel.value = l === null ? 'all' : String(l); },
    selected: function () { return selected; },
    visible: function () { return Object.keys(shown).length; }
  };
})();
