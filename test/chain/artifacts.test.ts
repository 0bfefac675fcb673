import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { x402UptoPermit2ProxyABI } from "@x402/evm"
import { artifactsPath, compileContracts, renderArtifacts } from "../../scripts/build-contracts.ts"
import { compilePermit2, permit2ArtifactPath, renderPermit2Artifact } from "../../scripts/permit2-build.ts"
import * as Artifacts from "../../src/chain/artifacts.ts"
import { permit2Abi, permit2Immutables, permit2RuntimeBytecode } from "../../src/chain/permit2Artifact.ts"
import { loadStretch } from "../support/Stopwatch.ts"

type AbiEntry = { readonly type: string; readonly name?: string }

const names = (abi: ReadonlyArray<AbiEntry>, type = "function") =>
  abi.filter((e) => e.type === type).map((e) => e.name)

/** JSON with sorted keys: ABI entries compared whatever order their fields were written in. */
const canonical = (value: unknown): string =>
  JSON.stringify(value, (_, v) =>
    typeof v === "object" && v !== null && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b)))
      : v
  )

describe("contract artifacts", () => {
  it("src/chain/artifacts.ts is exactly what contracts/*.sol compile to (run npm run build:contracts)", () => {
    const compilation = compileContracts()
    assert.deepStrictEqual(compilation.warnings, [])
    assert.strictEqual(readFileSync(artifactsPath, "utf8"), renderArtifacts(compilation))
  })

  // The compile is synchronous solc work (minutes on two shared cores): its bound is 180 s on an idle
  // machine, stretched by the load the machine is under when the file runs (test/support/Stopwatch.ts).
  it("src/chain/permit2Artifact.ts is exactly what Permit2's sources compile to (run npm run build:contracts)", {
    timeout: Math.ceil(180_000 * loadStretch())
  }, () => {
    const compilation = compilePermit2()
    assert.deepStrictEqual(compilation.warnings, [])
    assert.match(compilation.compilerVersion, /^0\.8\.17\+/)
    assert.strictEqual(readFileSync(permit2ArtifactPath, "utf8"), renderPermit2Artifact(compilation))
  })

  it("exports ABIs with the functions the router calls", () => {
    const usdc = names(Artifacts.testUsdcAbi)
    for (const fn of ["transferWithAuthorization", "receiveWithAuthorization", "cancelAuthorization"]) {
      assert.include(usdc, fn)
    }
    assert.strictEqual(usdc.filter((n) => n === "transferWithAuthorization").length, 2)
    assert.includeMembers(names(Artifacts.epochAnchorAbi), ["anchor", "roots", "owner"])
    assert.match(Artifacts.testUsdcBytecode, /^0x[0-9a-f]+$/)
    assert.match(Artifacts.epochAnchorBytecode, /^0x[0-9a-f]+$/)
    assert.includeMembers(names(permit2Abi), [
      "DOMAIN_SEPARATOR",
      "nonceBitmap",
      "permitWitnessTransferFrom",
      "allowance",
      "invalidateUnorderedNonces"
    ])
    assert.includeMembers(names(permit2Abi, "error"), ["InvalidNonce", "InvalidSigner", "SignatureExpired"])
  })

  it("the upto proxy implements every entry of the ABI @x402/evm calls it with", () => {
    const ours = new Set(Artifacts.uptoProxyAbi.map(canonical))
    for (const entry of x402UptoPermit2ProxyABI) {
      assert.isTrue(ours.has(canonical(entry)), `missing or different: ${entry.type} ${entry.name}`)
    }
    // and nothing callable beyond it
    assert.sameMembers(names(Artifacts.uptoProxyAbi), names(x402UptoPermit2ProxyABI))
    assert.match(Artifacts.uptoProxyDeployedBytecode, /^0x[0-9a-f]+$/)
  })

  it("Permit2's runtime code leaves exactly its two immutables to fill", () => {
    const ranges = [...permit2Immutables._CACHED_CHAIN_ID, ...permit2Immutables._CACHED_DOMAIN_SEPARATOR]
    assert.strictEqual(ranges.length, 2)
    for (const { start, length } of ranges) {
      assert.strictEqual(length, 32)
      assert.strictEqual(
        permit2RuntimeBytecode.slice(2 + start * 2, 2 + (start + length) * 2),
        "00".repeat(32)
      )
    }
  })
})
