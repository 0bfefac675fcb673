import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { artifactsPath, compileContracts, renderArtifacts } from "../../scripts/build-contracts.ts"
import * as Artifacts from "../../src/chain/artifacts.ts"

describe("contract artifacts", () => {
  it("src/chain/artifacts.ts is exactly what contracts/*.sol compile to (run npm run build:contracts)", () => {
    const compilation = compileContracts()
    assert.deepStrictEqual(compilation.warnings, [])
    assert.strictEqual(readFileSync(artifactsPath, "utf8"), renderArtifacts(compilation))
  })

  it("exports ABIs with the functions the router calls", () => {
    const names = (abi: ReadonlyArray<{ readonly type: string; readonly name?: string }>) =>
      abi.filter((e) => e.type === "function").map((e) => e.name)
    const usdc = names(Artifacts.testUsdcAbi)
    for (const fn of ["transferWithAuthorization", "receiveWithAuthorization", "cancelAuthorization"]) {
      assert.include(usdc, fn)
    }
    assert.strictEqual(usdc.filter((n) => n === "transferWithAuthorization").length, 2)
    assert.includeMembers(names(Artifacts.epochAnchorAbi), ["anchor", "roots", "owner"])
    assert.match(Artifacts.testUsdcBytecode, /^0x[0-9a-f]+$/)
    assert.match(Artifacts.epochAnchorBytecode, /^0x[0-9a-f]+$/)
  })
})
