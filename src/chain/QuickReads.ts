import { Effect } from "effect"
import { type Address, type Hex, toFunctionSelector } from "viem"
import { ChainError, revertReason } from "./ChainError.ts"
import { makeJsonRpcBatch, type PostJson, type RpcFailure } from "./JsonRpc.ts"

export { httpPost, type PostJson } from "./JsonRpc.ts"

/**
 * The paid path's chain reads (x402 verification: a payer's token balance, an EIP-3009 nonce's state,
 * a Permit2 nonce word and allowance), as plain `eth_call`s sent together: every read asked for in one
 * turn of the event loop goes out in one JSON-RPC batch (one HTTP request), whichever paid calls asked.
 * The calldata is written here and the 32-byte answers read here, without viem's generic ABI coder and
 * request pipeline: an x402 call's two reads were two viem `readContract`s, two HTTP requests and about
 * a millisecond of the router's CPU (issue 12, D325). Each read still gets its own answer or its own
 * error; a batch the node refuses, or one not answered within the bound, fails each of its reads. A
 * caller with CPU work to do while its reads travel sends them first (`send`, D382): the turn's end
 * comes only after that work.
 */
export interface QuickReads {
  /** A uint256 view (balances, allowances, bitmap words); `calldata` is one of `readCalldata`'s. */
  readonly uint: (operation: string, to: Address, calldata: () => Hex) => Effect.Effect<bigint, ChainError>
  /** A bool view (`authorizationState`). */
  readonly bool: (operation: string, to: Address, calldata: () => Hex) => Effect.Effect<boolean, ChainError>
  /**
   * Sends the reads asked for so far in this turn now instead of at its end: for a caller that has
   * started its reads and is about to spend the rest of the turn on CPU work (a signature check) while
   * they are in flight. Reads asked for later in the turn go in the turn's own batch.
   */
  readonly send: () => void
}

/** Most reads one HTTP request carries (providers cap batches; a bigger turn sends several). */
export const QUICK_BATCH_LIMIT = 50

const BALANCE_OF = toFunctionSelector("balanceOf(address)")
const AUTHORIZATION_STATE = toFunctionSelector("authorizationState(address,bytes32)")
const ALLOWANCE = toFunctionSelector("allowance(address,address)")
const NONCE_BITMAP = toFunctionSelector("nonceBitmap(address,uint256)")

const ADDRESS = /^0x[0-9a-fA-F]{40}$/
const WORD = /^0x[0-9a-fA-F]{64}$/

const addressWord = (address: Address) => {
  if (!ADDRESS.test(address))
    throw new ChainError({ reason: "Invalid", message: `not an address: ${address}` })
  return address.slice(2).toLowerCase().padStart(64, "0")
}
const bytes32Word = (value: Hex) => {
  if (!WORD.test(value)) throw new ChainError({ reason: "Invalid", message: "not a 32-byte value" })
  return value.slice(2).toLowerCase()
}
const uintWord = (value: bigint) => {
  if (value < 0n || value >= 2n ** 256n) throw new ChainError({ reason: "Invalid", message: "not a uint256" })
  return value.toString(16).padStart(64, "0")
}

/** Calldata of the views the paid path reads (the selectors are the ERC-20, EIP-3009 and Permit2 ones). */
export const readCalldata = {
  balanceOf: (owner: Address): Hex => `${BALANCE_OF}${addressWord(owner)}`,
  authorizationState: (authorizer: Address, nonce: Hex): Hex =>
    `${AUTHORIZATION_STATE}${addressWord(authorizer)}${bytes32Word(nonce)}`,
  allowance: (owner: Address, spender: Address): Hex =>
    `${ALLOWANCE}${addressWord(owner)}${addressWord(spender)}`,
  nonceBitmap: (owner: Address, wordPos: bigint): Hex =>
    `${NONCE_BITMAP}${addressWord(owner)}${uintWord(wordPos)}`
} as const

const rpcError = (operation: string, message: string) =>
  new ChainError({ reason: "Rpc", message: `${operation} failed: ${message}` })

/** Why a read failed: a revert is the contract's answer, anything else the node's (or its absence). */
const readError = (operation: string, failure: RpcFailure) => {
  if (failure._tag === "Unanswered") {
    return failure.timedOut
      ? new ChainError({ reason: "Timeout", message: `${operation}: the node did not answer in time` })
      : rpcError(operation, failure.message)
  }
  return failure.code === 3 || revertReason(failure.message) !== undefined
    ? new ChainError({ reason: "Reverted", message: `${operation} reverted: ${failure.message}` })
    : rpcError(operation, failure.message)
}

/**
 * Reads through `post` (the RPC endpoint), batched per event-loop turn (`JsonRpc.ts`, sent once, no
 * retry); `post` bounds each request's time.
 */
export const makeQuickReads = (post: PostJson): QuickReads => {
  const rpc = makeJsonRpcBatch(post, { limit: QUICK_BATCH_LIMIT, retries: 0 })

  const word = (operation: string, to: Address, calldata: () => Hex) =>
    Effect.suspend(() => {
      let data: Hex
      try {
        data = calldata()
      } catch (error) {
        return Effect.fail(
          error instanceof ChainError
            ? error
            : new ChainError({ reason: "Invalid", message: `${operation}: unencodable arguments` })
        )
      }
      return rpc.callWith("eth_call", [{ to, data }, "latest"], {
        result: (result) =>
          typeof result === "string" && WORD.test(result)
            ? Effect.succeed(result as Hex)
            : Effect.fail(rpcError(operation, "the call returned no 32-byte word (no contract?)")),
        failure: (failure) => readError(operation, failure)
      })
    })

  return {
    uint: (operation, to, calldata) => Effect.map(word(operation, to, calldata), (result) => BigInt(result)),
    bool: (operation, to, calldata) =>
      Effect.map(word(operation, to, calldata), (result) => BigInt(result) !== 0n),
    send: rpc.send
  }
}
