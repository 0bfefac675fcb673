import { assert, describe, it } from "@effect/vitest"
import { hashTypedData, recoverTypedDataAddress } from "viem"
import { privateKeyToAccount } from "viem/accounts"
import {
  APPROVAL_PRIMARY_TYPE,
  approvalDomain,
  approvalMessage,
  approvalTypes
} from "../../src/setup/Approval.ts"
import { approvalJson } from "./support.ts"

/** The agent-setup approval test vector of docs/protocol.md section 8. */
const account = privateKeyToAccount("0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a")
const terms = {
  setupId: `0x${"cd".repeat(32)}`,
  userCode: "BCDF-GHJK",
  harness: "claude-code" as const,
  network: "eip155:31337",
  budget: 5_000_000,
  keyExpiresAt: 1_767_830_400
}
const DIGEST = "0x43c0c8616b5e41d933d66ead8c09834854fb866d382a52d0d414986e1c397811"
const SIGNATURE =
  "0x398539bab06842e5b0dc59951ac091fb771d961ff7e1f1fbc38726ec1c1225101d65dbf0ef1be7340e26c192985b025447e20e3543fa86bcadffa21d3558dd8f1b"

describe("agent-setup approval typed data (docs/protocol.md section 8)", () => {
  const typed = {
    domain: approvalDomain(31337),
    types: approvalTypes,
    primaryType: APPROVAL_PRIMARY_TYPE,
    message: approvalMessage(terms, account.address)
  }

  it("the vector's digest and signature", async () => {
    assert.strictEqual(account.address, "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC")
    assert.strictEqual(hashTypedData(typed), DIGEST)
    assert.strictEqual(await account.signTypedData(typed), SIGNATURE)
    assert.strictEqual(await recoverTypedDataAddress({ ...typed, signature: SIGNATURE }), account.address)
  })

  it("the JSON the page hands to eth_signTypedData_v4 is the same typed data the router verifies", () => {
    const json = JSON.parse(approvalJson(terms, 31337, account)) as Parameters<typeof hashTypedData>[0]
    assert.strictEqual(hashTypedData(json), DIGEST)
    const lowered = JSON.parse(approvalJson(terms, 31337, account, 4_000_000)) as Parameters<
      typeof hashTypedData
    >[0]
    assert.strictEqual(
      hashTypedData(lowered),
      hashTypedData({ ...typed, message: { ...typed.message, budget: 4_000_000n } })
    )
  })
})
