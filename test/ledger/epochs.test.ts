import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import {
  concat,
  createPublicClient,
  type Hex,
  hashTypedData,
  http,
  keccak256,
  parseAbi,
  parseEventLogs,
  verifyTypedData
} from "viem"
import { Chain } from "../../src/chain/Chain.ts"
import { routerWithFleet } from "../support/Router.ts"
import { getReceipt, paidCompletion, type ReceiptReply, receiptWhere, waitForBook } from "./support.ts"

// What a client needs, and nothing from this repository: the anchor's ABI and OpenZeppelin's pair hash.
const anchorAbi = parseAbi([
  "function roots(uint64 epochId) view returns (bytes32)",
  "event EpochAnchored(uint64 indexed epochId, bytes32 root)"
])
const pair = (a: Hex, b: Hex) =>
  BigInt(a) < BigInt(b) ? keccak256(concat([a, b])) : keccak256(concat([b, a]))

type TypedData = Parameters<typeof hashTypedData>[0]

/** The check a client runs on the receipt it holds, with viem alone against the chain. */
const verifyWithViem = (rpcUrl: string, reply: ReceiptReply) =>
  Effect.promise(async () => {
    const inclusion = reply.inclusion!
    const client = createPublicClient({ transport: http(rpcUrl) })
    const typed = reply.typed_data as TypedData
    const signed = await verifyTypedData({
      address: reply.signer,
      signature: reply.signature!,
      ...(reply.typed_data as Omit<Parameters<typeof verifyTypedData>[0], "address" | "signature">)
    })
    const leaf = keccak256(hashTypedData(typed))
    const folded = inclusion.proof.reduce<Hex>(pair, leaf)
    const onChain = await client.readContract({
      address: inclusion.anchor_contract,
      abi: anchorAbi,
      functionName: "roots",
      args: [BigInt(inclusion.epoch_id)]
    })
    const anchorReceipt = await client.getTransactionReceipt({ hash: inclusion.anchor_tx })
    const anchored = parseEventLogs({ abi: anchorAbi, logs: anchorReceipt.logs, eventName: "EpochAnchored" })
    return { signed, leaf, folded, onChain, anchorReceipt, anchored, chainId: await client.getChainId() }
  })

describe("epochs: paid requests, close, anchor, inclusion proofs verified with viem", () => {
  layer(routerWithFleet({ epochSeconds: 2 }), { excludeTestServices: true, timeout: 240_000 })((it) => {
    it.effect(
      "every receipt is in its epoch's root on chain, after its refund",
      () =>
        Effect.gen(function* () {
          yield* waitForBook
          const chain = yield* Chain
          const sql = yield* SqlClient.SqlClient
          const first = yield* paidCompletion(0, "First receipt of the epoch.")
          // Until the epoch is anchored there is nothing to prove.
          const early = yield* getReceipt(first)
          assert.isNull(early!.inclusion)
          // Concurrent requests from two wallets: at least two of them share an epoch (2 s long).
          const ids = [
            first,
            ...(yield* Effect.all(
              [0, 1, 0, 1].map((wallet, i) => paidCompletion(wallet, `Concurrent request ${i}.`)),
              { concurrency: "unbounded" }
            ))
          ]

          const replies: Array<ReceiptReply> = []
          for (const id of ids) replies.push(yield* receiptWhere(id, (r) => r.inclusion !== null, 60_000))

          for (const reply of replies) {
            const inclusion = reply.inclusion!
            // The root covers the final receipt: payment landed and the overage refunded first.
            assert.isTrue(reply.final)
            assert.strictEqual(reply.receipt.settlement, "landed")
            if (reply.receipt.authorized > reply.receipt.charged) assert.isNotNull(reply.receipt.refund_ref)
            assert.strictEqual(inclusion.epoch_id, reply.receipt.epoch_id)
            assert.strictEqual(inclusion.chain_id, chain.chainId)
            assert.strictEqual(inclusion.anchor_contract, chain.anchor)

            const v = yield* verifyWithViem(chain.rpcUrl, reply)
            assert.isTrue(v.signed)
            assert.strictEqual(v.chainId, inclusion.chain_id)
            assert.strictEqual(v.leaf, inclusion.leaf)
            assert.strictEqual(v.folded, inclusion.root)
            assert.strictEqual(v.onChain, inclusion.root)
            assert.strictEqual(v.anchorReceipt.status, "success")
            assert.strictEqual(v.anchorReceipt.to?.toLowerCase(), inclusion.anchor_contract.toLowerCase())
            assert.strictEqual(v.anchored.length, 1)
            assert.strictEqual(v.anchored[0]!.args.epochId, BigInt(inclusion.epoch_id))
            assert.strictEqual(v.anchored[0]!.args.root, inclusion.root)
            // A receipt changed after the fact no longer folds to the root.
            const forged = {
              ...(reply.typed_data as TypedData & { message: Record<string, unknown> }),
              message: { ...(reply.typed_data as { message: Record<string, unknown> }).message, charged: "1" }
            }
            assert.notStrictEqual(
              inclusion.proof.reduce<Hex>(pair, keccak256(hashTypedData(forged as TypedData))),
              inclusion.root
            )
          }

          assert.isTrue(
            replies.some((r) => r.inclusion!.proof.length > 0),
            "an epoch with several receipts"
          )

          // The book agrees: each epoch closed once, with every one of its receipts in the root.
          const epochIds = [...new Set(replies.map((r) => r.receipt.epoch_id))]
          for (const epochId of epochIds) {
            const [epoch] = yield* sql<{ status: string; root: string; anchor_tx: string; receipts: number }>`
              SELECT status, root, anchor_tx, receipts FROM epochs WHERE epoch_id = ${epochId}
            `
            const [count] = yield* sql<{ n: number; anchored: number }>`
              SELECT count(*)::int AS n, count(leaf)::int AS anchored FROM receipts WHERE epoch_id = ${epochId}
            `
            assert.strictEqual(epoch!.status, "closed")
            assert.strictEqual(epoch!.receipts, count!.n)
            assert.strictEqual(count!.anchored, count!.n)
            const reply = replies.find((r) => r.receipt.epoch_id === epochId)!
            assert.strictEqual(epoch!.root, reply.inclusion!.root)
            assert.strictEqual(epoch!.anchor_tx, reply.inclusion!.anchor_tx)
            const events = yield* Effect.promise(() =>
              chain.publicClient.getContractEvents({
                address: chain.anchor,
                abi: anchorAbi,
                eventName: "EpochAnchored",
                args: { epochId: BigInt(epochId) },
                fromBlock: 0n
              })
            )
            assert.strictEqual(events.length, 1)
          }
        }),
      { timeout: 180_000 }
    )
  })
})
