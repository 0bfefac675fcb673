import { readFileSync } from "node:fs"
import { describe, expect, it } from "vitest"
import { routerArgs } from "../../bench/support/Children.ts"

describe("the benches start the router as `npm start` does", () => {
  it("take node's arguments from the start script, past the exec that hands npm's signals to the router (D570)", () => {
    const start = (JSON.parse(readFileSync("package.json", "utf8")) as { scripts: Record<string, string> })
      .scripts.start!
    expect(start.startsWith("exec node ")).toBe(true)
    expect(routerArgs().join(" ")).toBe(start.slice("exec node ".length))
    expect(routerArgs().at(-1)).toBe("src/main.ts")
  })
})
