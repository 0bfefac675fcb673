import fs from "node:fs"
const p = JSON.parse(fs.readFileSync(process.argv[2]))
const byId = new Map(p.nodes.map((n) => [n.id, n]))
const self = new Map()
const dt = p.timeDeltas; let total = 0
for (let i = 0; i < p.samples.length; i++) { const id = p.samples[i]; self.set(id, (self.get(id) ?? 0) + dt[i]); total += dt[i] }
// self time by function
const fn = new Map()
for (const [id, t] of self) { const n = byId.get(id); const k = `${n.callFrame.functionName || "(anon)"} ${n.callFrame.url.split("/").slice(-2).join("/")}:${n.callFrame.lineNumber}`; fn.set(k, (fn.get(k) ?? 0) + t) }
console.log("total ms", (total / 1000).toFixed(0))
for (const [k, t] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, Number(process.argv[3] ?? 40))) console.log((100 * t / total).toFixed(1).padStart(5) + "%", k)
// inclusive by url package
const parent = new Map(); for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
const incl = new Map()
for (const [id, t] of self) { const seen = new Set(); let cur = id; while (cur !== undefined) { const n = byId.get(cur); const k = n.callFrame.functionName; if (k && !seen.has(k)) { seen.add(k); incl.set(k, (incl.get(k) ?? 0) + t) } cur = parent.get(cur) } }
console.log("--- inclusive (by function name)")
for (const [k, t] of [...incl].sort((a, b) => b[1] - a[1]).slice(0, Number(process.argv[4] ?? 60))) console.log((100 * t / total).toFixed(1).padStart(5) + "%", k)
