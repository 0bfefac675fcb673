// The live market page (docs/decisions.md D130): the snapshot from /v1/market/events, or polled from
// /v1/market/snapshot when the events answer 503; candles and the index from their own endpoints.
;(() => {
  const LC = window.LightweightCharts
  const $ = (sel, el = document) => el.querySelector(sel)
  const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"))
  const time = (ms) => new Date(ms).toLocaleTimeString("en-GB")
  const status = $("#status")
  const chartOptions = {
    autoSize: true,
    // The browser's own locale may be one Intl does not take (a headless "en-US@posix").
    localization: { locale: "en-US" },
    layout: { background: { color: "transparent" }, textColor: "#8b949e" },
    grid: { vertLines: { color: "#21262d" }, horzLines: { color: "#21262d" } },
    timeScale: { timeVisible: true, secondsVisible: false },
    rightPriceScale: { borderColor: "#2d333b" }
  }
  const el = (tag, attrs = {}, text) => {
    const node = document.createElement(tag)
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v)
    if (text !== undefined) node.textContent = text
    return node
  }

  const indexChart = LC.createChart($("#index-chart"), chartOptions)
  const indexLine = indexChart.addSeries(LC.LineSeries, { color: "#58a6ff", lineWidth: 2 })
  const panels = new Map()
  let lastClear = null
  let refreshing = false

  const panelFor = (modelClass) => {
    let panel = panels.get(modelClass)
    if (panel) return panel
    const section = el("section", { "data-class": modelClass, "data-candle-count": "0" })
    const head = el("h2")
    head.append(el("span", {}, modelClass), el("span", { class: "dim figure", "data-role": "last" }, ""))
    const chart = el("div", { class: "chart" })
    const stats = el("div", { class: "stats" })
    const ladder = el("table")
    ladder.append(el("thead"), el("tbody"))
    $("thead", ladder).innerHTML = "<tr><th>ask in / out</th><th>depth</th><th>capacity rps</th></tr>"
    section.append(head, chart, stats, ladder)
    $("#classes").append(section)
    const candles = LC.createChart(chart, chartOptions).addSeries(LC.CandlestickSeries, {
      upColor: "#3fb950",
      downColor: "#f85149",
      wickUpColor: "#3fb950",
      wickDownColor: "#f85149",
      borderVisible: false
    })
    panel = { section, stats, ladder, candles }
    panels.set(modelClass, panel)
    return panel
  }

  const renderStats = (panel, s) => {
    const change =
      s.change_bps === null ? "–" : `${s.change_bps > 0 ? "+" : ""}${(s.change_bps / 100).toFixed(2)}%`
    const cls = s.change_bps > 0 ? "up" : s.change_bps < 0 ? "down" : ""
    panel.stats.innerHTML = ""
    for (const [label, value, extra] of [
      ["24 h VWAP", fmt(s.vwap)],
      ["change", change, cls],
      ["high / low", `${fmt(s.high)} / ${fmt(s.low)}`],
      ["clears", fmt(s.count)],
      ["volume", fmt(s.volume)],
      ["tokens", fmt(s.volume_tokens)],
      ["TTFT p50", s.ttft_p50_ms === null ? "–" : `${s.ttft_p50_ms} ms`],
      ["TTFT p90", s.ttft_p90_ms === null ? "–" : `${s.ttft_p90_ms} ms`]
    ]) {
      const cell = el("div", { class: "dim" }, label)
      const b = el("b", { class: `figure ${extra ?? ""}` }, value)
      cell.append(b)
      panel.stats.append(cell)
    }
    $('[data-role="last"]', panel.section).textContent = s.last === null ? "" : `last ${fmt(s.last)}`
  }

  const renderLadder = (panel, book) => {
    const body = $("tbody", panel.ladder)
    body.innerHTML = ""
    for (const level of (book?.levels ?? []).slice(0, 6)) {
      const row = el("tr")
      row.append(
        el("td", {}, `${fmt(level.price_in)} / ${fmt(level.price_out)}`),
        el("td", {}, String(level.depth)),
        el("td", {}, fmt(level.capacity_rps))
      )
      body.append(row)
    }
  }

  const renderTape = (clears) => {
    const body = $("#tape")
    body.innerHTML = ""
    for (const c of clears) {
      const row = el("tr", { "data-request-id": c.request_id })
      row.append(
        el("td", {}, time(c.at)),
        el("td", {}, c.model_class),
        el("td", {}, c.provider),
        el("td", {}, `${fmt(c.price_in)} / ${fmt(c.price_out)}`),
        el("td", { class: "hide-narrow" }, c.price_setter),
        el("td", {}, `${c.ttft_ms} ms`)
      )
      body.append(row)
    }
  }

  const refreshSeries = async (classes) => {
    if (refreshing) return
    refreshing = true
    try {
      await Promise.all(
        classes.map(async (modelClass) => {
          const r = await fetch(
            `/v1/market/candles?model_class=${encodeURIComponent(modelClass)}&window_ms=3600000&bucket_ms=60000`
          )
          if (!r.ok) return
          const body = await r.json()
          const panel = panelFor(modelClass)
          panel.candles.setData(
            body.candles.map((c) =>
              c.open === null
                ? { time: c.t / 1000 }
                : { time: c.t / 1000, open: c.open, high: c.high, low: c.low, close: c.close }
            )
          )
          panel.section.setAttribute(
            "data-candle-count",
            String(body.candles.reduce((n, c) => n + c.count, 0))
          )
        })
      )
      const r = await fetch("/v1/market/index?window_ms=86400000&bucket_ms=900000")
      if (r.ok) {
        const body = await r.json()
        indexLine.setData(
          body.series.map((p) =>
            p.value === null ? { time: p.t / 1000 } : { time: p.t / 1000, value: p.value }
          )
        )
        $("#index-weights").textContent = body.components
          .filter((c) => c.weight > 0)
          .map((c) => `${c.model_class} ${(c.weight * 100).toFixed(0)}%`)
          .join(" · ")
      }
    } finally {
      refreshing = false
    }
  }

  const render = (snapshot) => {
    const classes = snapshot.book.map((b) => b.model_class)
    for (const book of snapshot.book) renderLadder(panelFor(book.model_class), book)
    for (const s of snapshot.economics.stats) renderStats(panelFor(s.model_class), s)
    renderTape(snapshot.economics.last_clears)
    $("#index-value").textContent = fmt(snapshot.economics.index.value)
    document.body.setAttribute("data-sequence", String(snapshot.sequence))
    const newest = snapshot.economics.last_clears[0]?.request_id ?? null
    if (newest !== lastClear || panels.size === 0 || !document.body.hasAttribute("data-series")) {
      lastClear = newest
      document.body.setAttribute("data-series", "1")
      refreshSeries(classes)
    }
  }

  let polling = null
  const poll = async () => {
    try {
      const r = await fetch("/v1/market/snapshot")
      if (r.ok) render(await r.json())
    } catch {
      // the next poll tries again
    }
  }
  const startPolling = () => {
    if (polling !== null) return
    status.setAttribute("data-mode", "polling")
    status.textContent = "polling the snapshot (live events are full)"
    poll()
    polling = setInterval(poll, 2000)
    // Try the live stream again after a while; the snapshot keeps the page current meanwhile.
    setTimeout(connect, 30_000)
  }

  const connect = () => {
    const events = new EventSource("/v1/market/events")
    events.onopen = () => {
      if (polling !== null) clearInterval(polling)
      polling = null
      status.setAttribute("data-mode", "live")
      status.textContent = "live"
    }
    events.onmessage = (e) => render(JSON.parse(e.data))
    events.onerror = () => {
      // A 503 (capacity) closes the EventSource for good; a dropped stream reconnects by itself.
      if (events.readyState === EventSource.CLOSED) startPolling()
    }
  }

  poll()
  connect()
})()
