import { Effect, Schedule } from "effect"
import { type Hash, isAddressEqual, parseEventLogs, TransactionReceiptNotFoundError } from "viem"
import { testUsdcAbi } from "../chain/artifacts.ts"
import type { ChainShape } from "../chain/Chain.ts"
import { type ChainError, fromViemError } from "../chain/ChainError.ts"
import type { TxTransfers } from "./Discrepancies.ts"

/**
 * What reconciliation reads from the chain. Mined transactions and anchored roots do not change: each is
 * read from the chain once (a root once it matched), and a read that fails is tried twice more.
 */
export interface ChainReads {
  /** The token transfers of a transaction, and whether it is mined, reverted or missing. */
  readonly transfersOf: (hash: Hash) => Effect.Effect<TxTransfers, ChainError>
  /** The root anchored on chain for an epoch whose recorded root is `recorded`. */
  readonly anchoredRoot: (epochId: bigint, recorded: string) => Effect.Effect<string, ChainError>
}

const RETRY = { times: 2, schedule: Schedule.spaced("300 millis") }

export const makeChainReads = (chain: ChainShape): ChainReads => {
  const txCache = new Map<Hash, TxTransfers>()
  const verifiedEpochs = new Set<string>()
  const remember = (hash: Hash, value: TxTransfers) => {
    if (txCache.size >= 20_000) txCache.delete(txCache.keys().next().value!)
    txCache.set(hash, value)
  }

  const transfersOf = (hash: Hash) =>
    Effect.gen(function* () {
      const cached = txCache.get(hash)
      if (cached !== undefined) return cached
      const receipt = yield* Effect.tryPromise({
        try: () =>
          chain.publicClient
            .getTransactionReceipt({ hash })
            .catch((e) => (e instanceof TransactionReceiptNotFoundError ? null : Promise.reject(e))),
        catch: fromViemError("Reconciliation.transfersOf")
      }).pipe(Effect.retry(RETRY))
      if (receipt === null) return { status: "missing", transfers: [] } satisfies TxTransfers
      const transfers = parseEventLogs({ abi: testUsdcAbi, eventName: "Transfer", logs: receipt.logs })
        .filter((log) => isAddressEqual(log.address, chain.token))
        .map((log) => ({ from: log.args.from, to: log.args.to, value: log.args.value }))
      const result: TxTransfers = { status: receipt.status, transfers }
      remember(hash, result)
      return result
    })

  const anchoredRoot = (epochId: bigint, recorded: string) =>
    Effect.gen(function* () {
      const key = `${epochId}:${recorded}`
      if (verifiedEpochs.has(key)) return recorded
      const onChain: string = yield* chain.anchoredRoot(epochId).pipe(Effect.retry(RETRY))
      if (onChain.toLowerCase() === recorded.toLowerCase()) verifiedEpochs.add(key)
      return onChain
    })

  return { transfersOf, anchoredRoot }
}
