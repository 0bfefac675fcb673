import { Effect, Result } from "effect"
import {
  type Address,
  getAddress,
  type Hash,
  type Hex,
  type HttpTransport,
  hexToBigInt,
  type PublicClient,
  pad,
  toEventSelector,
  toHex,
  type Chain as ViemChain
} from "viem"
import { type ChainError, unreadable } from "./ChainError.ts"
import { call } from "./Connection.ts"

const AUTHORIZATION_USED = toEventSelector("AuthorizationUsed(address,bytes32)")
const AUTHORIZATION_CANCELED = toEventSelector("AuthorizationCanceled(address,bytes32)")
const TRANSFER = toEventSelector("Transfer(address,address,uint256)")

/**
 * Blocks one `eth_getLogs` asks for at first: hosted nodes cap a query's range (some at 500 blocks, most at
 * 1,000 to 10,000, or by the size of the answer), and a query filtered on both indexed topics finds at most one
 * log. A refused query is asked again over half the range, down to `FATE_MIN_PAGE_BLOCKS`; the look fails
 * when the node refuses even that.
 */
export const FATE_PAGE_BLOCKS = 1_000n
export const FATE_MIN_PAGE_BLOCKS = 8n
/** Pages one look reads forward before it stops undecided (refused queries not counted). */
export const FATE_MAX_PAGES = 64

/**
 * What spent an EIP-3009 nonce, read from the token's own events (D533): the token marks a nonce used for
 * a transfer and for a cancellation alike (`authorizationState` is true for both), so only the event and
 * the transfer beside it say whether money moved, and where.
 */
export type AuthorizationFate =
  /** `AuthorizationUsed`, with the token's next log in that transaction: its `Transfer` out of the authorizer's wallet. */
  | { readonly _tag: "Transferred"; readonly txHash: Hash; readonly to: Address; readonly value: bigint }
  /** `AuthorizationCanceled`: the authorizer cancelled the nonce; nothing moved. */
  | { readonly _tag: "Canceled"; readonly txHash: Hash }
  /** `AuthorizationUsed` with no transfer out of the authorizer's wallet after it (no FiatToken does this). */
  | { readonly _tag: "UsedOtherwise"; readonly txHash: Hash }

interface RawLog {
  readonly topics: ReadonlyArray<Hex>
  readonly transactionHash: Hash | null
}

const isLogList = (value: unknown): value is ReadonlyArray<RawLog> =>
  Array.isArray(value) &&
  value.every((log: unknown) => {
    if (typeof log !== "object" || log === null) return false
    const { topics, transactionHash } = log as Record<string, unknown>
    return (
      Array.isArray(topics) &&
      topics.every((topic) => typeof topic === "string") &&
      (transactionHash === null || typeof transactionHash === "string")
    )
  })

/**
 * Finds the event that spent `authorizer`'s `nonce` on `token`, reading forward from the first block at or
 * after `sinceSeconds` (nothing before then could have spent it: the nonce was unspent when the payment was
 * verified), a page at a time, to the newest block. `undefined`: no such event found (or not within
 * `FATE_MAX_PAGES`), or one whose transaction's receipt disagrees: undecided, never taken as paid nor as unpaid.
 */
export const readAuthorizationFate = (
  client: PublicClient<HttpTransport, ViemChain>,
  token: Address,
  authorizer: Address,
  nonce: Hex,
  sinceSeconds: bigint
): Effect.Effect<AuthorizationFate | undefined, ChainError> =>
  Effect.gen(function* () {
    const topics = [
      [AUTHORIZATION_USED, AUTHORIZATION_CANCELED],
      pad(authorizer.toLowerCase() as Hex),
      nonce.toLowerCase() as Hex
    ]
    const head = yield* call("Chain.authorizationFate", () => client.getBlock({ blockTag: "latest" }))
    // Nothing since then yet (the chain's clock behind ours): nothing to read.
    if (head.timestamp < sinceSeconds) return undefined
    let fromBlock = yield* firstBlockAt(client, head.number, sinceSeconds)
    let page = FATE_PAGE_BLOCKS
    let pages = 0
    while (pages < FATE_MAX_PAGES && fromBlock <= head.number) {
      const toBlock = fromBlock + page - 1n < head.number ? fromBlock + page - 1n : head.number
      const logs = yield* Effect.result(
        call("Chain.authorizationFate", () =>
          client.request({
            method: "eth_getLogs",
            params: [{ address: token, fromBlock: toHex(fromBlock), toBlock: toHex(toBlock), topics }]
          })
        )
      )
      if (Result.isFailure(logs)) {
        // A node that refuses the range (too many blocks, too large an answer) is asked for half of it.
        if (page === FATE_MIN_PAGE_BLOCKS) return yield* logs.failure
        page = page / 2n > FATE_MIN_PAGE_BLOCKS ? page / 2n : FATE_MIN_PAGE_BLOCKS
        continue
      }
      pages++
      // A malformed answer is the node's failure (a `ChainError`, so the row is held), never a defect.
      if (!isLogList(logs.success)) return yield* unreadable("Chain.authorizationFate")
      const found = logs.success.find((log) => log.transactionHash !== null)
      if (found !== undefined) return yield* fateOf(client, token, authorizer, found)
      fromBlock = toBlock + 1n
    }
    return undefined
  }).pipe(Effect.withSpan("Chain.authorizationFate"))

/** The first block whose timestamp is at or after `seconds` (`head + 1` when none is): a binary search. */
const firstBlockAt = (client: PublicClient<HttpTransport, ViemChain>, head: bigint, seconds: bigint) =>
  Effect.gen(function* () {
    let low = 0n
    let high = head + 1n
    while (low < high) {
      const middle = (low + high) / 2n
      const block = yield* call("Chain.authorizationFate", () => client.getBlock({ blockNumber: middle }))
      if (block.timestamp < seconds) low = middle + 1n
      else high = middle
    }
    return low
  })

/**
 * The fate an `AuthorizationUsed` or `AuthorizationCanceled` log tells, reading its transaction's logs for a
 * use; `undefined` when the receipt does not hold the log and one after it.
 */
const fateOf = (
  client: PublicClient<HttpTransport, ViemChain>,
  token: Address,
  authorizer: Address,
  log: RawLog
): Effect.Effect<AuthorizationFate | undefined, ChainError> =>
  Effect.gen(function* () {
    const txHash = log.transactionHash as Hash
    if (log.topics[0]?.toLowerCase() === AUTHORIZATION_CANCELED) return { _tag: "Canceled", txHash }
    const receipt = yield* call("Chain.authorizationFate", () =>
      client.getTransactionReceipt({ hash: txHash })
    )
    // A FiatToken marks the nonce used, then transfers (`_markAuthorizationUsed`, `_transfer`): the log right
    // after this one in its transaction is the transfer this authorization made, and no other. The log is
    // found in the receipt by its contents (nodes number a receipt's logs per block or per transaction).
    const at = receipt.logs.findIndex(
      (l) =>
        l.address.toLowerCase() === token.toLowerCase() &&
        l.topics.length === log.topics.length &&
        l.topics.every((topic, i) => topic.toLowerCase() === log.topics[i]?.toLowerCase())
    )
    // Not there, or nothing after it: the node's answers disagree (a reorg, a lagging replica), no evidence.
    const next = at < 0 ? undefined : receipt.logs[at + 1]
    if (next === undefined) return undefined
    if (
      next.address.toLowerCase() !== token.toLowerCase() ||
      next.topics[0]?.toLowerCase() !== TRANSFER ||
      next.topics[1]?.toLowerCase() !== pad(authorizer.toLowerCase() as Hex) ||
      next.topics[2] === undefined
    )
      return { _tag: "UsedOtherwise", txHash }
    return {
      _tag: "Transferred",
      txHash,
      to: getAddress(`0x${next.topics[2].slice(26)}`),
      value: hexToBigInt(next.data)
    }
  })
