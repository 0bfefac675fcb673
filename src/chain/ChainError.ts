import { Effect, Schema } from "effect"
import { BaseError, ContractFunctionRevertedError, WaitForTransactionReceiptTimeoutError } from "viem"

/**
 * Why a chain operation failed:
 * - `Reverted`: the contract refused (simulation or gas estimation hit a revert); `message` is the revert reason.
 * - `Timeout`: no receipt in time.
 * - `Rpc`: the node could not be reached or answered with an error.
 * - `Invalid`: the caller passed an argument the contracts cannot take (e.g. an epoch id beyond uint64).
 * - `Config`: the chain configuration is unusable (bad key or address, chain id mismatch).
 * - `Devnet`: the embedded Anvil could not be started or seeded.
 */
export const ChainErrorReason = Schema.Literals(["Reverted", "Timeout", "Rpc", "Invalid", "Config", "Devnet"])
export type ChainErrorReason = typeof ChainErrorReason.Type

/** Messages are written here, never copied from viem: viem's long messages carry the RPC URL, which can hold an API key. */
export class ChainError extends Schema.TaggedError<ChainError>()("ChainError", {
  reason: ChainErrorReason,
  message: Schema.String,
  cause: Schema.optional(Schema.Defect())
}) {}

/** A node's answer that is not of the shape the method promises (a malformed or partial reply). */
export const unreadable = (operation: string) =>
  new ChainError({ reason: "Rpc", message: `${operation} failed: the node's answer is not what was asked` })

/**
 * Classifies a thrown viem error into a `ChainError` whose message names the operation and, for reverts, the
 * reason. viem errors are replaced by a summary (name, short message, node details) in `cause` because their
 * full text lists the request URL.
 */
export const fromViemError =
  (operation: string) =>
  (error: unknown): ChainError => {
    if (!(error instanceof BaseError)) {
      return new ChainError({ reason: "Rpc", message: `${operation} failed`, cause: error })
    }
    const cause = summarize(error)
    const reverted = error.walk((e) => e instanceof ContractFunctionRevertedError)
    if (reverted instanceof ContractFunctionRevertedError) {
      const reason = reverted.reason ?? reverted.data?.errorName ?? "execution reverted"
      return new ChainError({ reason: "Reverted", message: `${operation} reverted: ${reason}`, cause })
    }
    if (error.walk((e) => e instanceof WaitForTransactionReceiptTimeoutError) !== null) {
      return new ChainError({
        reason: "Timeout",
        message: `${operation} timed out waiting for a receipt`,
        cause
      })
    }
    const revertText = revertReason(error.details ?? "")
    if (revertText !== undefined) {
      return new ChainError({ reason: "Reverted", message: `${operation} reverted: ${revertText}`, cause })
    }
    return new ChainError({ reason: "Rpc", message: `${operation} failed: ${error.shortMessage}`, cause })
  }

/** A viem call as an Effect that fails with the classified `ChainError`. */
export const viemCall = <A>(operation: string, evaluate: () => Promise<A>): Effect.Effect<A, ChainError> =>
  Effect.tryPromise({ try: evaluate, catch: fromViemError(operation) })

const summarize = (error: BaseError): Error => {
  const summary = new Error(error.details ? `${error.shortMessage} (${error.details})` : error.shortMessage)
  summary.name = error.name
  return summary
}

/**
 * The revert reason in a node's error message: what follows "execution reverted:" (to the line's end),
 * "execution reverted" when the node gives none, undefined when the message is no revert. Gas estimation
 * and calls report reverts as RPC errors reading "execution reverted: <reason>"; only the reason is kept.
 */
export const revertReason = (message: string): string | undefined => {
  const match = /execution reverted(?::\s*([^\n]*))?/i.exec(message)
  if (match === null) return undefined
  return match[1]?.trim() || "execution reverted"
}
