import { readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, normalize, relative } from "node:path"
import { assert, describe, it } from "@effect/vitest"

/**
 * The floors of docs/architecture.md, read from the imports of `src/` as they are: no module imports
 * from a higher floor, and the folders on one floor never import each other in a circle.
 */

const SRC = join(import.meta.dirname, "..", "..", "src")

/** A top-level file's floor, or a folder's. */
const FLOORS: Readonly<Record<string, number>> = {
  "RouterConfig.ts": 0,
  "Background.ts": 0,
  "Telemetry.ts": 0,
  domain: 1,
  chain: 1,
  db: 1,
  devnet: 1,
  process: 1,
  market: 2,
  payment: 2,
  ledger: 2,
  inference: 3,
  points: 3,
  integrity: 3,
  setup: 3,
  tasks: 3,
  evals: 3,
  marketdata: 3,
  http: 4,
  "Banner.ts": 5,
  "Router.ts": 5,
  "Shutdown.ts": 5,
  "Cluster.ts": 5,
  "main.ts": 6,
  cli: 6
}

const sourceFiles = (dir: string): Array<string> =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return sourceFiles(path)
    return name.endsWith(".ts") ? [path] : []
  })

/** The top-level folder (or file) of a path inside `src/`. */
const placeOf = (path: string) => relative(SRC, path).split("/")[0]!

const imports = sourceFiles(SRC).flatMap((file) =>
  [...readFileSync(file, "utf8").matchAll(/from\s+"(\.{1,2}\/[^"]+)"/g)].map((match) => ({
    from: placeOf(file),
    to: placeOf(normalize(join(dirname(file), match[1]!))),
    file: relative(SRC, file),
    target: match[1]!,
    targetFile: relative(SRC, normalize(join(dirname(file), match[1]!)))
  }))
)

/** Every circle in a graph, each as the path that closes it. */
const circlesOf = (edges: ReadonlyMap<string, ReadonlySet<string>>) => {
  const circles: Array<string> = []
  const visit = (node: string, path: ReadonlyArray<string>) => {
    for (const next of edges.get(node) ?? []) {
      if (next === path[0]) circles.push([...path, next].join(" -> "))
      else if (!path.includes(next) && next > path[0]!) visit(next, [...path, next])
    }
  }
  for (const node of edges.keys()) visit(node, [node])
  return circles
}

const graph = (pairs: ReadonlyArray<readonly [string, string]>) => {
  const edges = new Map<string, Set<string>>()
  for (const [from, to] of pairs) if (from !== to) edges.set(from, (edges.get(from) ?? new Set()).add(to))
  return edges
}

describe("floors", () => {
  it("every place in src/ has a floor", () => {
    const places = new Set(sourceFiles(SRC).map(placeOf))
    assert.deepStrictEqual(
      [...places].filter((place) => FLOORS[place] === undefined),
      []
    )
  })

  it("no import runs up the floors", () => {
    const up = imports
      .filter((i) => FLOORS[i.to]! > FLOORS[i.from]!)
      .map((i) => `${i.file} imports ${i.target} (floor ${FLOORS[i.to]} above ${FLOORS[i.from]})`)
    assert.deepStrictEqual(up, [])
  })

  it("folders on one floor never import each other in a circle", () => {
    assert.deepStrictEqual(circlesOf(graph(imports.map((i) => [i.from, i.to] as const))), [])
  })

  it("no module imports itself back through others", () => {
    assert.deepStrictEqual(circlesOf(graph(imports.map((i) => [i.file, i.targetFile] as const))), [])
  })
})
