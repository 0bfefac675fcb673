import * as http from "node:http"
import * as https from "node:https"
import { Effect } from "effect"
import { type Address, type Hex, toFunctionSelector } from "viem"
import { ChainError } from "./ChainError.ts"

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

interface Pending {
  readonly operation: string
  readonly to: Address
  readonly data: Hex
  readonly resume: (answer: Effect.Effect<Hex, ChainError>) => void
}

interface RpcAnswer {
  readonly id?: unknown
  readonly result?: unknown
  readonly error?: { readonly code?: unknown; readonly message?: unknown }
}

const rpcError = (operation: string, message: string) =>
  new ChainError({ reason: "Rpc", message: `${operation} failed: ${message}` })

/** A node's error for one call: a revert is the contract's answer, anything else the node's. */
const answerError = (operation: string, error: NonNullable<RpcAnswer["error"]>) => {
  const message = typeof error.message === "string" ? error.message.slice(0, 200) : "error"
  return error.code === 3 || /execution reverted/i.test(message)
    ? new ChainError({ reason: "Reverted", message: `${operation} reverted: ${message}` })
    : rpcError(operation, message)
}

/** One HTTP POST of a JSON body: the status and the body of the answer. */
export type PostJson = (body: string) => Promise<{ readonly status: number; readonly body: string }>

/**
 * POSTs over Node's own HTTP client with kept-alive connections (a few): cheaper per request than the
 * global `fetch` (WHATWG streams, a Response and its body reader), which the profile showed.
 */
export const httpPost = (rpcUrl: string, timeoutMs: number): PostJson => {
  const url = new URL(rpcUrl)
  const client = url.protocol === "https:" ? https : http
  const agent = new client.Agent({ keepAlive: true, maxSockets: 8 })
  return (body) =>
    new Promise((resolve, reject) => {
      const request = client.request(
        url,
        {
          method: "POST",
          agent,
          headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) }
        },
        (response) => {
          const chunks: Array<Buffer> = []
          response.on("data", (chunk: Buffer) => chunks.push(chunk))
          response.on("end", () => {
            clearTimeout(timer)
            resolve({ status: response.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") })
          })
          response.on("error", fail)
        }
      )
      const fail = (error: Error) => {
        clearTimeout(timer)
        reject(error)
      }
      const timer = setTimeout(() => {
        const timedOut = new Error("the node did not answer in time")
        timedOut.name = "TimeoutError"
        request.destroy(timedOut)
      }, timeoutMs)
      request.on("error", fail)
      request.end(body)
    })
}

/**
 * Reads through `post` (the RPC endpoint), batched per event-loop turn; `post` bounds each request's time.
 */
export const makeQuickReads = (post: PostJson): QuickReads => {
  let queued: Array<Pending> = []

  const send = async (batch: ReadonlyArray<Pending>) => {
    const body = JSON.stringify(
      batch.map((read, id) => ({
        jsonrpc: "2.0",
        id,
        method: "eth_call",
        params: [{ to: read.to, data: read.data }, "latest"]
      }))
    )
    let answers: unknown
    try {
      const response = await post(body)
      answers = response.status === 200 ? JSON.parse(response.body) : `HTTP ${response.status}`
    } catch (error) {
      const timedOut = error instanceof Error && error.name === "TimeoutError"
      for (const read of batch) {
        read.resume(
          Effect.fail(
            timedOut
              ? new ChainError({
                  reason: "Timeout",
                  message: `${read.operation}: the node did not answer in time`
                })
              : rpcError(read.operation, "the node could not be reached or answered no JSON")
          )
        )
      }
      return
    }
    const byId = new Map<number, RpcAnswer>()
    if (Array.isArray(answers)) {
      for (const answer of answers as ReadonlyArray<RpcAnswer>) {
        if (typeof answer?.id === "number") byId.set(answer.id, answer)
      }
    }
    const outcome = (read: Pending, answer: RpcAnswer | undefined): Effect.Effect<Hex, ChainError> => {
      if (answer === undefined) {
        return Effect.fail(
          rpcError(read.operation, typeof answers === "string" ? answers : "no answer in the batch")
        )
      }
      if (answer.error !== undefined && answer.error !== null) {
        return Effect.fail(answerError(read.operation, answer.error))
      }
      return typeof answer.result === "string" && WORD.test(answer.result)
        ? Effect.succeed(answer.result as Hex)
        : Effect.fail(rpcError(read.operation, "the call returned no 32-byte word (no contract?)"))
    }
    batch.forEach((read, id) => {
      read.resume(outcome(read, byId.get(id)))
    })
  }

  const flush = () => {
    const all = queued
    queued = []
    for (let start = 0; start < all.length; start += QUICK_BATCH_LIMIT) {
      void send(all.slice(start, start + QUICK_BATCH_LIMIT))
    }
  }

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
      return Effect.callback<Hex, ChainError>((resume) => {
        queued.push({ operation, to, data, resume })
        if (queued.length === 1) setImmediate(flush)
      })
    })

  return {
    uint: (operation, to, calldata) => Effect.map(word(operation, to, calldata), (result) => BigInt(result)),
    bool: (operation, to, calldata) =>
      Effect.map(word(operation, to, calldata), (result) => BigInt(result) !== 0n),
    // The turn's scheduled flush still runs, and finds nothing (or what was asked for since) to send.
    send: () => {
      if (queued.length > 0) flush()
    }
  }
}
