/**
 * What the objects born between two V8 heap snapshots of one process cost, and who holds them:
 *
 *   node --import tsx bench/heapDiff.ts before.heapsnapshot after.heapsnapshot [per=N] [top=K]
 *
 * (`npm run bench:load` with `BENCH_SNAPSHOTS=<dir>` writes such a pair around its held streams.) V8 keeps
 * an object's id from one snapshot to the next, so the objects of `after` whose id `before` lacks are the
 * ones made since and still alive; with `per=N` (say the number of held streams) every figure is also
 * divided by N. It prints:
 *  - the totals (every object's own size in both snapshots, and the new objects'),
 *  - the new objects by kind (constructor, closure or V8 type), count and size,
 *  - who holds them: the new objects' dominator tree (an object's dominator is the one every path from
 *    the roots to it passes through, so it retains it), cut where a new object's dominator is an older
 *    object; each such root of new memory with its retained size, grouped by the older holder's kind, the
 *    edge and its own kind, and for the largest groups the kinds inside them.
 * Weak edges are not followed (they retain nothing). Asserts nothing.
 */
import { closeSync, fstatSync, openSync, readSync } from "node:fs"

export interface Snapshot {
  readonly nodeCount: number
  readonly nodeFields: number
  readonly nodes: Float64Array
  readonly edges: Uint32Array
  readonly edgeFields: number
  readonly firstEdge: Uint32Array
  readonly strings: ReadonlyArray<string>
  readonly nodeTypes: ReadonlyArray<string>
  readonly edgeTypes: ReadonlyArray<string>
  /** Each closure's source position, by node number: script id, line and column (0-based). */
  readonly locations: Map<number, [number, number, number]>
  readonly f: { type: number; name: number; id: number; selfSize: number; edgeCount: number }
  readonly e: { type: number; name: number; to: number }
}

const readAll = (path: string) => {
  const fd = openSync(path, "r")
  const size = fstatSync(fd).size
  const buf = Buffer.allocUnsafe(size)
  let read = 0
  while (read < size) read += readSync(fd, buf, read, size - read, read)
  closeSync(fd)
  return buf
}

/** The integers of a JSON array starting at `start` (just after its `[`), into `into`; returns the index after `]`. */
const readInts = (buf: Buffer, start: number, into: Float64Array | Uint32Array) => {
  let i = start
  let n = 0
  let value = 0
  let inNumber = false
  for (; ; i++) {
    const c = buf[i]!
    if (c >= 48 && c <= 57) {
      value = value * 10 + (c - 48)
      inNumber = true
    } else {
      if (inNumber) {
        into[n++] = value
        value = 0
        inNumber = false
      }
      if (c === 93) break // ]
    }
  }
  if (n !== into.length) throw new Error(`expected ${into.length} numbers, read ${n}`)
  return i + 1
}

export const load = (path: string): Snapshot => {
  const buf = readAll(path)
  const nodesAt = buf.indexOf('"nodes":[')
  const header = buf.toString("utf8", 0, nodesAt).replace(/,\s*$/, "")
  const meta = JSON.parse(`${header}}`).snapshot
  const nodeFieldNames: Array<string> = meta.meta.node_fields
  const edgeFieldNames: Array<string> = meta.meta.edge_fields
  const nodeCount: number = meta.node_count
  const edgeCount: number = meta.edge_count
  const nodes = new Float64Array(nodeCount * nodeFieldNames.length)
  const afterNodes = readInts(buf, nodesAt + '"nodes":['.length, nodes)
  const edgesAt = buf.indexOf('"edges":[', afterNodes)
  const edges = new Uint32Array(edgeCount * edgeFieldNames.length)
  readInts(buf, edgesAt + '"edges":['.length, edges)
  const locations = new Map<number, [number, number, number]>()
  const locationsAt = buf.indexOf('"locations":[', edgesAt)
  if (locationsAt >= 0) {
    const end = buf.indexOf("]", locationsAt)
    const numbers = buf.toString("latin1", locationsAt + '"locations":['.length, end).split(",")
    for (let i = 0; i + 3 < numbers.length; i += 4) {
      locations.set(Number(numbers[i]) / nodeFieldNames.length, [
        Number(numbers[i + 1]),
        Number(numbers[i + 2]),
        Number(numbers[i + 3])
      ])
    }
  }
  const stringsAt = buf.indexOf('"strings":[', edgesAt)
  const end = buf.lastIndexOf("]")
  const strings = JSON.parse(buf.toString("utf8", stringsAt + '"strings":'.length, end + 1))
  const f = {
    type: nodeFieldNames.indexOf("type"),
    name: nodeFieldNames.indexOf("name"),
    id: nodeFieldNames.indexOf("id"),
    selfSize: nodeFieldNames.indexOf("self_size"),
    edgeCount: nodeFieldNames.indexOf("edge_count")
  }
  const e = {
    type: edgeFieldNames.indexOf("type"),
    name: edgeFieldNames.indexOf("name_or_index"),
    to: edgeFieldNames.indexOf("to_node")
  }
  const firstEdge = new Uint32Array(nodeCount + 1)
  for (let n = 0, at = 0; n < nodeCount; n++) {
    firstEdge[n] = at
    at += nodes[n * nodeFieldNames.length + f.edgeCount]! * edgeFieldNames.length
    firstEdge[n + 1] = at
  }
  return {
    nodeCount,
    nodeFields: nodeFieldNames.length,
    nodes,
    edges,
    edgeFields: edgeFieldNames.length,
    firstEdge,
    strings,
    locations,
    nodeTypes: meta.meta.node_types[0],
    edgeTypes: meta.meta.edge_types[0],
    f,
    e
  }
}

/** An object's kind: its constructor (objects), `(closure) name`, or its V8 type and name. */
export const kindOf = (s: Snapshot, n: number) => {
  const type = s.nodeTypes[s.nodes[n * s.nodeFields + s.f.type]!]!
  const name = s.strings[s.nodes[n * s.nodeFields + s.f.name]!]!
  switch (type) {
    case "object":
    case "native":
      return name.length > 60 ? `${name.slice(0, 57)}...` : name
    case "closure":
      return `(closure) ${name || "anonymous"}`
    case "string":
    case "concatenated string":
    case "sliced string":
      return "(string)"
    case "code":
      return "(code)"
    case "number":
      return "(number)"
    case "array":
      return `(array) ${name}`
    case "hidden":
      return `(hidden) ${name}`
    default:
      return `(${type}) ${name.length > 40 ? `${name.slice(0, 37)}...` : name}`
  }
}

export const edgeLabel = (s: Snapshot, at: number) => {
  const type = s.edgeTypes[s.edges[at + s.e.type]!]!
  const name = s.edges[at + s.e.name]!
  if (type === "element" || type === "hidden") return `[${type === "hidden" ? "h" : ""}${name}]`
  const text = s.strings[name] ?? String(name)
  return type === "context" ? `ctx.${text}` : type === "internal" ? `{${text}}` : `.${text}`
}

/** The node an edge named `name` of `n` leads to. */
export const follow = (s: Snapshot, n: number, name: string) => {
  for (let at = s.firstEdge[n]!; at < s.firstEdge[n + 1]!; at += s.edgeFields) {
    const type = s.edgeTypes[s.edges[at + s.e.type]!]!
    if (type !== "element" && type !== "hidden" && s.strings[s.edges[at + s.e.name]!] === name)
      return s.edges[at + s.e.to]! / s.nodeFields
  }
  return undefined
}

/** Where a closure's code is: `file:line:column` (the file from its script's name, shortened). */
export const placeOf = (s: Snapshot, n: number) => {
  const location = s.locations.get(n)
  if (location === undefined) return undefined
  const shared = follow(s, n, "shared")
  const script =
    shared === undefined
      ? undefined
      : (follow(s, shared, "script") ?? follow(s, shared, "script_or_debug_info"))
  const nameNode = script === undefined ? undefined : follow(s, script, "name")
  const file =
    nameNode === undefined
      ? `script ${location[0]}`
      : s.strings[s.nodes[nameNode * s.nodeFields + s.f.name]!]!
  const short = file
    .replace(/^file:\/\//, "")
    .replace(/^.*\/node_modules\//, "~/")
    .replace(/^.*\/(src|bench|test)\//, "$1/")
  return `${short}:${location[1] + 1}:${location[2] + 1}`
}

/** Immediate dominators (Cooper, Harvey and Kennedy's iteration over the reverse postorder), weak edges left out. */
export const dominators = (s: Snapshot) => {
  const N = s.nodeCount
  const weak = s.edgeTypes.indexOf("weak")
  const post = new Int32Array(N).fill(-1) // postorder number
  const order = new Int32Array(N) // nodes by postorder number
  let count = 0
  // Iterative DFS from node 0 (the synthetic root).
  const stack = new Int32Array(N)
  const cursor = new Uint32Array(N)
  const seen = new Uint8Array(N)
  let top = 0
  stack[top++] = 0
  seen[0] = 1
  cursor[0] = s.firstEdge[0]!
  while (top > 0) {
    const n = stack[top - 1]!
    const end = s.firstEdge[n + 1]!
    let at = cursor[n]!
    let pushed = false
    for (; at < end; at += s.edgeFields) {
      if (s.edges[at + s.e.type] === weak) continue
      const to = s.edges[at + s.e.to]! / s.nodeFields
      if (seen[to]) continue
      seen[to] = 1
      cursor[n] = at + s.edgeFields
      cursor[to] = s.firstEdge[to]!
      stack[top++] = to
      pushed = true
      break
    }
    if (!pushed) {
      cursor[n] = end
      top--
      post[n] = count
      order[count++] = n
    }
  }
  // Predecessors among reached nodes (CSR).
  const predCount = new Uint32Array(N + 1)
  for (let n = 0; n < N; n++) {
    if (post[n] < 0) continue
    for (let at = s.firstEdge[n]!; at < s.firstEdge[n + 1]!; at += s.edgeFields) {
      if (s.edges[at + s.e.type] === weak) continue
      predCount[s.edges[at + s.e.to]! / s.nodeFields + 1]!++
    }
  }
  for (let n = 0; n < N; n++) predCount[n + 1]! += predCount[n]!
  const preds = new Int32Array(predCount[N]!)
  const fill = predCount.slice(0, N)
  for (let n = 0; n < N; n++) {
    if (post[n] < 0) continue
    for (let at = s.firstEdge[n]!; at < s.firstEdge[n + 1]!; at += s.edgeFields) {
      if (s.edges[at + s.e.type] === weak) continue
      const to = s.edges[at + s.e.to]! / s.nodeFields
      preds[fill[to]!++] = n
    }
  }
  const idom = new Int32Array(N).fill(-1)
  idom[0] = 0
  const intersect = (a: number, b: number) => {
    while (a !== b) {
      while (post[a]! < post[b]!) a = idom[a]!
      while (post[b]! < post[a]!) b = idom[b]!
    }
    return a
  }
  for (let changed = true; changed; ) {
    changed = false
    for (let k = count - 2; k >= 0; k--) {
      const n = order[k]!
      let dom = -1
      for (let p = predCount[n]!; p < predCount[n + 1]!; p++) {
        const pred = preds[p]!
        if (idom[pred] === -1) continue
        dom = dom === -1 ? pred : intersect(pred, dom)
      }
      if (dom !== -1 && idom[n] !== dom) {
        idom[n] = dom
        changed = true
      }
    }
  }
  // Retained sizes: children before parents (postorder).
  const retained = new Float64Array(N)
  for (let k = 0; k < count; k++) {
    const n = order[k]!
    retained[n]! += s.nodes[n * s.nodeFields + s.f.selfSize]!
    if (n !== 0) retained[idom[n]!]! += retained[n]!
  }
  return { idom, retained, order, count }
}

const main = () => {
  const [beforePath, afterPath, ...rest] = process.argv.slice(2)
  if (beforePath === undefined || afterPath === undefined) {
    process.stderr.write("usage: bench/heapDiff.ts before.heapsnapshot after.heapsnapshot [per=N] [top=K]\n")
    process.exit(2)
  }
  const option = (key: string, fallback: number) => {
    const found = rest.find((r) => r.startsWith(`${key}=`))
    return found === undefined ? fallback : Number(found.slice(key.length + 1))
  }
  const per = option("per", 1)
  const top = option("top", 30)
  const kb = (bytes: number) => (bytes / 1024 / per).toFixed(per === 1 ? 0 : 2)
  const unit = per === 1 ? "KB" : `KB per ${per}th`

  const before = load(beforePath)
  const oldIds = new Set<number>()
  let beforeTotal = 0
  for (let n = 0; n < before.nodeCount; n++) {
    oldIds.add(before.nodes[n * before.nodeFields + before.f.id]!)
    beforeTotal += before.nodes[n * before.nodeFields + before.f.selfSize]!
  }
  const s = load(afterPath)
  const isNew = new Uint8Array(s.nodeCount)
  let afterTotal = 0
  let newTotal = 0
  let newCount = 0
  const byKind = new Map<string, { count: number; size: number }>()
  for (let n = 0; n < s.nodeCount; n++) {
    const size = s.nodes[n * s.nodeFields + s.f.selfSize]!
    afterTotal += size
    if (oldIds.has(s.nodes[n * s.nodeFields + s.f.id]!)) continue
    isNew[n] = 1
    newTotal += size
    newCount++
    const kind = kindOf(s, n)
    const entry = byKind.get(kind) ?? { count: 0, size: 0 }
    entry.count++
    entry.size += size
    byKind.set(kind, entry)
  }
  const out: Array<string> = []
  const perLabel =
    per === 1
      ? ""
      : ` (per 1 of ${per}: ${kb(afterTotal - beforeTotal)} KB all objects, ${kb(newTotal)} KB new, ${(newCount / per).toFixed(1)} new objects)`
  out.push(
    `self sizes: before ${(beforeTotal / 1048576).toFixed(1)} MB, after ${(afterTotal / 1048576).toFixed(1)} MB (+${((afterTotal - beforeTotal) / 1048576).toFixed(2)} MB); new objects ${newCount} with ${(newTotal / 1048576).toFixed(2)} MB${perLabel}`,
    "",
    `New objects by kind (count${per === 1 ? "" : " per"}, ${unit}):`
  )
  for (const [kind, { count, size }] of [...byKind].sort((a, b) => b[1].size - a[1].size).slice(0, top)) {
    out.push(`  ${kb(size).padStart(9)}  ${(count / per).toFixed(per === 1 ? 0 : 2).padStart(9)}  ${kind}`)
  }

  const { idom, retained, order, count } = dominators(s)
  // The root of each new object's new subtree: the first new object down its dominator chain.
  const rootOf = new Int32Array(s.nodeCount).fill(-1)
  for (let k = count - 1; k >= 0; k--) {
    const n = order[k]!
    if (!isNew[n]) continue
    const d = idom[n]!
    rootOf[n] = isNew[d] && n !== 0 ? rootOf[d]! : n
  }
  const edgeTo = (from: number, to: number) => {
    for (let at = s.firstEdge[from]!; at < s.firstEdge[from + 1]!; at += s.edgeFields) {
      if (s.edges[at + s.e.to]! / s.nodeFields === to) return edgeLabel(s, at)
    }
    return "~" // dominated through several paths
  }
  const groups = new Map<string, { count: number; retained: number; roots: Array<number> }>()
  for (let n = 0; n < s.nodeCount; n++) {
    if (rootOf[n] !== n) continue
    const d = idom[n]!
    const key = `${kindOf(s, d)} ${edgeTo(d, n)} -> ${kindOf(s, n)}`
    const g = groups.get(key) ?? { count: 0, retained: 0, roots: [] }
    g.count++
    g.retained += retained[n]!
    g.roots.push(n)
    groups.set(key, g)
  }
  const sorted = [...groups].sort((a, b) => b[1].retained - a[1].retained)
  out.push(
    "",
    `Who holds the new objects: older holder, edge -> new root (count${per === 1 ? "" : " per"}, retained ${unit}):`
  )
  for (const [key, g] of sorted.slice(0, top)) {
    out.push(
      `  ${kb(g.retained).padStart(9)}  ${(g.count / per).toFixed(per === 1 ? 0 : 2).padStart(9)}  ${key}`
    )
  }
  // Inside the largest groups: the kinds of every new object under their roots.
  const groupOfRoot = new Map<number, string>()
  for (const [key, g] of sorted.slice(0, 5)) for (const r of g.roots) groupOfRoot.set(r, key)
  const inside = new Map<string, Map<string, { count: number; size: number }>>()
  for (let n = 0; n < s.nodeCount; n++) {
    const r = rootOf[n]!
    if (r < 0) continue
    const key = groupOfRoot.get(r)
    if (key === undefined) continue
    const kinds = inside.get(key) ?? new Map()
    const kind = kindOf(s, n)
    const entry = kinds.get(kind) ?? { count: 0, size: 0 }
    entry.count++
    entry.size += s.nodes[n * s.nodeFields + s.f.selfSize]!
    kinds.set(kind, entry)
    inside.set(key, kinds)
  }
  for (const [key] of sorted.slice(0, 5)) {
    const kinds = inside.get(key)
    if (kinds === undefined) continue
    out.push("", `Inside ${key}:`)
    for (const [kind, { count, size }] of [...kinds].sort((a, b) => b[1].size - a[1].size).slice(0, 25)) {
      out.push(`  ${kb(size).padStart(9)}  ${(count / per).toFixed(per === 1 ? 0 : 2).padStart(9)}  ${kind}`)
    }
    // One root's dominator chain up to the roots: where the group hangs.
    const sample = groups.get(key)!.roots[0]!
    const chain: Array<string> = []
    for (let n = sample, i = 0; n !== 0 && i < 12; n = idom[n]!, i++) chain.push(kindOf(s, n))
    out.push(`  held via: ${chain.join(" <- ")}`)
  }
  // The new closures by where their code is (what keeps a context alive is usually one of them).
  const places = new Map<string, { count: number; retained: number }>()
  for (let n = 0; n < s.nodeCount; n++) {
    if (!isNew[n] || s.nodeTypes[s.nodes[n * s.nodeFields + s.f.type]!] !== "closure") continue
    const place = `${placeOf(s, n) ?? "?"} ${kindOf(s, n).replace("(closure) ", "")}`
    const entry = places.get(place) ?? { count: 0, retained: 0 }
    entry.count++
    entry.retained += retained[n]!
    places.set(place, entry)
  }
  out.push("", `New closures by place (count${per === 1 ? "" : " per"}, retained ${unit}, overlapping):`)
  for (const [place, { count, retained: r }] of [...places]
    .sort((a, b) => b[1].count - a[1].count)
    .slice(0, top * 2)) {
    out.push(`  ${kb(r).padStart(9)}  ${(count / per).toFixed(per === 1 ? 0 : 2).padStart(9)}  ${place}`)
  }
  // The roots of new memory by kind and the names they are referred to by (what a root is, in code).
  const names = new Map<number, Set<string>>()
  for (let n = 0; n < s.nodeCount; n++) {
    for (let at = s.firstEdge[n]!; at < s.firstEdge[n + 1]!; at += s.edgeFields) {
      const to = s.edges[at + s.e.to]! / s.nodeFields
      if (rootOf[to] !== to) continue
      const type = s.edgeTypes[s.edges[at + s.e.type]!]!
      if (type === "element" || type === "hidden" || type === "weak") continue
      const label = edgeLabel(s, at)
      // Numbered internal slots differ from one object to the next: they would split a kind into many.
      if (/^\{\d+\}$/.test(label)) continue
      const set = names.get(to) ?? new Set()
      if (set.size < 4) set.add(label)
      names.set(to, set)
    }
  }
  const named = new Map<string, { count: number; retained: number }>()
  for (const [to, set] of names) {
    const key = `${kindOf(s, to)} as ${[...set].sort().join(" ")}`
    const entry = named.get(key) ?? { count: 0, retained: 0 }
    entry.count++
    entry.retained += retained[to]!
    named.set(key, entry)
  }
  out.push(
    "",
    `Roots of new memory by kind and the names that refer to them (count${per === 1 ? "" : " per"}, retained ${unit}):`
  )
  for (const [key, { count, retained: r }] of [...named]
    .sort((a, b) => b[1].retained - a[1].retained)
    .slice(0, top * 2)) {
    out.push(`  ${kb(r).padStart(9)}  ${(count / per).toFixed(per === 1 ? 0 : 2).padStart(9)}  ${key}`)
  }
  // `tree=KIND`: for one root of each named group of that kind, its dominator subtree, three levels deep.
  const treeKind = rest.find((r) => r.startsWith("tree="))?.slice(5)
  if (treeKind !== undefined) {
    const children = new Map<number, Array<number>>()
    for (let k = 0; k < count; k++) {
      const n = order[k]!
      if (n === 0) continue
      const list = children.get(idom[n]!) ?? []
      list.push(n)
      children.set(idom[n]!, list)
    }
    const describe = (n: number) => {
      const place =
        s.nodeTypes[s.nodes[n * s.nodeFields + s.f.type]!] === "closure" ? ` @${placeOf(s, n)}` : ""
      return `${kindOf(s, n)}${place}`
    }
    const print = (n: number, depth: number, indent: string) => {
      const list = (children.get(n) ?? []).sort((a, b) => retained[b]! - retained[a]!)
      for (const c of list.slice(0, 10)) {
        if (retained[c]! < 100) continue
        out.push(`${indent}${String(retained[c]).padStart(6)} B ${edgeTo(n, c)} ${describe(c)}`)
        if (depth > 1) print(c, depth - 1, `${indent}    `)
      }
    }
    const sampled = new Set<string>()
    for (const [to, set] of names) {
      if (kindOf(s, to) !== treeKind) continue
      const key = [...set].sort().join(" ")
      if (sampled.has(key)) continue
      sampled.add(key)
      out.push("", `${treeKind} as ${key}: ${retained[to]} B retained`)
      print(to, Number(rest.find((r) => r.startsWith("depth="))?.slice(6) ?? 3), "  ")
    }
  }
  // Who refers to one root of each large group (its retainers, with the edge).
  const retainersOf = new Map<number, Array<string>>()
  const wanted = new Set<number>()
  for (const [, g] of sorted.slice(0, 12)) wanted.add(g.roots[0]!)
  for (let n = 0; n < s.nodeCount; n++) {
    for (let at = s.firstEdge[n]!; at < s.firstEdge[n + 1]!; at += s.edgeFields) {
      const to = s.edges[at + s.e.to]! / s.nodeFields
      if (!wanted.has(to)) continue
      const list = retainersOf.get(to) ?? []
      const place =
        s.nodeTypes[s.nodes[n * s.nodeFields + s.f.type]!] === "closure" ? ` @${placeOf(s, n)}` : ""
      list.push(`${kindOf(s, n)}${place}${isNew[n] ? "*" : ""} ${edgeLabel(s, at)}`)
      retainersOf.set(to, list)
    }
  }
  out.push("", "Retainers of one root of each large group (* = itself new):")
  for (const [key, g] of sorted.slice(0, 12)) {
    const list = retainersOf.get(g.roots[0]!) ?? []
    out.push(`  ${key}:`, ...list.slice(0, 10).map((r) => `      ${r}`))
  }
  process.stdout.write(`${out.join("\n")}\n`)
}

// Run as a script (not when imported for a one-off question of a snapshot).
if (process.argv[1]?.endsWith("heapDiff.ts")) main()
