import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import {
  type Address,
  type Hash,
  type Hex,
  type HttpTransport,
  type PublicClient,
  pad,
  toEventSelector,
  toHex,
  type Chain as ViemChain
} from "viem"
import { FATE_MIN_PAGE_BLOCKS, readAuthorizationFate } from "../../src/chain/AuthorizationFate.ts"

/**
 * How the look at what spent a nonce reads a node (D533), against a node of the test's making: blocks one a
 * second from genesis, a cap on the range of a log query, and one event in one transaction.
 */

const token: Address = "0x00000000000000000000000000000000000000aa"
const payer: Address = "0x00000000000000000000000000000000000000a1"
const treasury: Address = "0x00000000000000000000000000000000000000b2"
const nonce: Hex = `0x${"07".repeat(32)}`
const txHash: Hash = `0x${"ef".repeat(32)}`
const USED = toEventSelector("AuthorizationUsed(address,bytes32)")
const TRANSFER = toEventSelector("Transfer(address,address,uint256)")

interface Node {
  readonly head: bigint
  /** The block of the `AuthorizationUsed` log. */
  readonly at: bigint
  /** A log query over more blocks than this is refused. */
  readonly cap: bigint
  /** The transaction's logs, as the receipt gives them. */
  readonly receiptLogs: ReadonlyArray<{
    readonly address: Address
    readonly topics: ReadonlyArray<Hex>
    readonly data: Hex
  }>
}

const nodeOf = (node: Node) => {
  const ranges: Array<readonly [bigint, bigint, "refused" | "read"]> = []
  const usedTopics = [USED, pad(payer), nonce]
  const client = {
    getBlock: async ({ blockNumber, blockTag }: { blockNumber?: bigint; blockTag?: string }) => {
      const number = blockTag === "latest" ? node.head : blockNumber!
      return { number, timestamp: 1_000n + number }
    },
    request: async ({ params }: { params: ReadonlyArray<{ fromBlock: Hex; toBlock: Hex }> }) => {
      const from = BigInt(params[0]!.fromBlock)
      const to = BigInt(params[0]!.toBlock)
      if (to - from + 1n > node.cap) {
        ranges.push([from, to, "refused"])
        throw new Error("query exceeds max block range")
      }
      ranges.push([from, to, "read"])
      return node.at >= from && node.at <= to ? [{ topics: usedTopics, transactionHash: txHash }] : []
    },
    getTransactionReceipt: async () => ({
      logs: node.receiptLogs.map((log, i) => ({ ...log, logIndex: 40 + i }))
    })
  } as unknown as PublicClient<HttpTransport, ViemChain>
  return { client, ranges }
}

const usedLog = { address: token, topics: [USED, pad(payer), nonce], data: "0x" as Hex }
const transferLog = (to: Address, value: bigint) => ({
  address: token,
  topics: [TRANSFER, pad(payer), pad(to)],
  data: toHex(value, { size: 32 })
})

describe("the look at what spent a nonce (D533)", () => {
  it.effect(
    "reads forward from the block at `since`, halving a refused range, and finds the transfer after the use",
    () =>
      Effect.gen(function* () {
        const { client, ranges } = nodeOf({
          head: 5_000n,
          at: 3_210n,
          cap: 100n,
          receiptLogs: [transferLog(treasury, 1n), usedLog, transferLog(treasury, 20_000n)]
        })
        // Block n's time is 1,000 + n: `since` 3,000 is block 2,000.
        const fate = yield* readAuthorizationFate(client, token, payer, nonce, 3_000n)
        assert.deepStrictEqual(fate, { _tag: "Transferred", txHash, to: treasury, value: 20_000n })
        const read = ranges.filter(([, , how]) => how === "read")
        assert.strictEqual(read[0]![0], 2_000n, "the first block read is the first at `since`")
        // 1,000 → 500 → 250 → 125 refused, then pages of 62 blocks.
        assert.deepStrictEqual(
          ranges.filter(([, , how]) => how === "refused").map(([from, to]) => to - from + 1n),
          [1_000n, 500n, 250n, 125n]
        )
        assert.isTrue(read.every(([from, to]) => to - from + 1n === 62n))
      })
  )

  it.effect("the log right after the use decides: no log after it, or the use missing, is no evidence", () =>
    Effect.gen(function* () {
      const base = { head: 2_000n, at: 1_500n, cap: 10_000n }
      assert.isUndefined(
        yield* readAuthorizationFate(
          nodeOf({ ...base, receiptLogs: [usedLog] }).client,
          token,
          payer,
          nonce,
          0n
        )
      )
      assert.isUndefined(
        yield* readAuthorizationFate(
          nodeOf({ ...base, receiptLogs: [transferLog(treasury, 20_000n)] }).client,
          token,
          payer,
          nonce,
          0n
        )
      )
      // Something else right after the use: a use that moved nothing out of the payer's wallet.
      const other = yield* readAuthorizationFate(
        nodeOf({ ...base, receiptLogs: [usedLog, { ...usedLog, topics: [USED, pad(treasury), nonce] }] })
          .client,
        token,
        payer,
        nonce,
        0n
      )
      assert.deepStrictEqual(other, { _tag: "UsedOtherwise", txHash })
    })
  )

  it.effect(
    "nothing to read when the chain's time is before `since`; a node that refuses every range fails the look",
    () =>
      Effect.gen(function* () {
        const quiet = nodeOf({ head: 100n, at: 50n, cap: 1_000n, receiptLogs: [usedLog] })
        assert.isUndefined(yield* readAuthorizationFate(quiet.client, token, payer, nonce, 5_000n))
        assert.deepStrictEqual(quiet.ranges, [])
        const stingy = nodeOf({ head: 100n, at: 50n, cap: FATE_MIN_PAGE_BLOCKS - 1n, receiptLogs: [usedLog] })
        const refused = yield* Effect.flip(readAuthorizationFate(stingy.client, token, payer, nonce, 0n))
        assert.strictEqual(refused._tag, "ChainError")
        assert.deepStrictEqual(
          stingy.ranges.map(([from, to]) => to - from + 1n),
          [101n, 101n, 101n, 101n, 62n, 31n, 15n, 8n]
        )
      })
  )

  it.effect("a malformed log answer fails the look as the node's failure, not as a defect", () =>
    Effect.gen(function* () {
      for (const answer of [
        null,
        { logs: [] },
        [{ transactionHash: txHash }],
        [{ topics: [1], transactionHash: null }]
      ]) {
        const { client } = nodeOf({ head: 100n, at: 50n, cap: 1_000n, receiptLogs: [usedLog] })
        const malformed = {
          ...client,
          request: async () => answer
        } as unknown as PublicClient<HttpTransport, ViemChain>
        const failed = yield* Effect.flip(readAuthorizationFate(malformed, token, payer, nonce, 0n))
        assert.strictEqual(failed._tag, "ChainError", JSON.stringify(answer))
      }
    })
  )
})
