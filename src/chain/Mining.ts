import { Effect } from "effect"
import { repeatInBackground } from "../Background.ts"
import type { PostJson } from "./QuickReads.ts"

/**
 * How the embedded chain mines (D450). `automine`: a block per transaction (Anvil's default). `interval`:
 * a block every `seconds`, carrying every transaction sent in that time. `paced`: a block per transaction
 * while transactions are few, one block a second while they come at `MINING_PACE.busyPerSecond` or more.
 */
export type EmbeddedMining =
  | { readonly _tag: "automine" }
  | { readonly _tag: "interval"; readonly seconds: number }
  | { readonly _tag: "paced" }

export interface MiningPace {
  /** Transactions a second (over the blocks since the last look) from which the chain mines a block a second. */
  readonly busyPerSecond: number
  /** Below this many a second for `quietLooks` looks in a row, the chain goes back to a block per transaction. */
  readonly quietPerSecond: number
  readonly quietLooks: number
  /** Between two looks. */
  readonly lookEveryMs: number
}

/**
 * A block per transaction costs the embedded Anvil about 2.5 ms of CPU per transaction (one x402 settlement
 * each) and holds the paid path's chain reads behind each block; a block a second, about 0.4 ms (D450). A
 * block a second with nothing to carry is not free either: Anvil keeps every block in memory and in its
 * state file (about 1.7 KB each), so a quiet chain mines only when it is sent something.
 */
export const MINING_PACE: MiningPace = {
  busyPerSecond: 5,
  quietPerSecond: 2,
  quietLooks: 10,
  lookEveryMs: 1000
}

/** Most blocks one look counts transactions in (the newest ones; a jump of more, `anvil_mine`, is empty blocks). */
const LOOK_BACK = 20

interface Answer {
  readonly id?: unknown
  readonly result?: unknown
  readonly error?: unknown
}

/** JSON-RPC calls in one batch; the results in order, or a thrown error when any call failed. */
const rpcBatch = async (post: PostJson, calls: ReadonlyArray<readonly [string, ReadonlyArray<unknown>]>) => {
  const response = await post(
    JSON.stringify(calls.map(([method, params], id) => ({ jsonrpc: "2.0", id, method, params })))
  )
  if (response.status !== 200) throw new Error(`HTTP ${response.status}`)
  const answers = JSON.parse(response.body) as ReadonlyArray<Answer>
  return calls.map((_, id) => {
    const answer = answers.find((a) => a.id === id)
    if (answer === undefined || answer.error !== undefined) throw new Error(`${calls[id]![0]} failed`)
    return answer.result
  })
}

/** The pacer's state and its one look; exported for tests, which drive the looks themselves. */
export const makeMiningPacer = (post: PostJson, pace: MiningPace = MINING_PACE) => {
  let interval = false
  let seen: bigint | undefined
  let quiet = 0
  let lookedAt = 0

  const look = async () => {
    // The mode as the chain has it, not as this pacer last set it: a switch whose reply was lost (it took
    // effect, the call failed) is seen at the next look, and a chain left mining a block a second while
    // quiet still goes back to a block per transaction.
    const [head, automine] = await rpcBatch(post, [
      ["eth_blockNumber", []],
      ["anvil_getAutomine", []]
    ])
    if (automine === interval) {
      interval = automine !== true
      quiet = 0
    }
    const block = BigInt(head as string)
    const now = Date.now()
    const since = seen
    const elapsedS = Math.max(0.001, (now - lookedAt) / 1000)
    seen = block
    lookedAt = now
    if (since === undefined || block <= since) {
      if (interval && since !== undefined) quiet++
    } else {
      const first = block - since > BigInt(LOOK_BACK) ? block - BigInt(LOOK_BACK) + 1n : since + 1n
      const numbers: Array<bigint> = []
      for (let n = first; n <= block; n++) numbers.push(n)
      const counts = await rpcBatch(
        post,
        numbers.map((n) => ["eth_getBlockTransactionCountByNumber", [`0x${n.toString(16)}`]] as const)
      )
      const perSecond = counts.reduce<number>((sum, count) => sum + Number(count), 0) / elapsedS
      if (!interval && perSecond >= pace.busyPerSecond) {
        await rpcBatch(post, [["evm_setIntervalMining", [1]]])
        interval = true
        quiet = 0
      } else if (interval) {
        quiet = perSecond < pace.quietPerSecond ? quiet + 1 : 0
      }
    }
    if (interval && quiet >= pace.quietLooks) {
      // Automine mines what is pending at once, then a block per transaction.
      await rpcBatch(post, [["evm_setAutomine", [true]]])
      interval = false
      quiet = 0
    }
  }

  return {
    look: Effect.tryPromise(look),
    /** Whether the chain mines a block a second now (as this pacer set it). */
    intervalMining: () => interval
  }
}

/** Paces the embedded chain's mining for as long as the current scope lives (`paced`). */
export const paceMining = (post: PostJson, pace: MiningPace = MINING_PACE) =>
  repeatInBackground(makeMiningPacer(post, pace).look, {
    every: `${pace.lookEveryMs} millis`,
    failure: "the embedded chain's mining pace could not be set",
    level: "warning"
  })
