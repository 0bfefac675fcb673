import { Clock, Deferred, Effect, Redacted } from "effect"
import type { Address, Hash, Hex } from "viem"
import { privateKeyToAddress } from "viem/accounts"
import { ChainError, revertReason, unreadable } from "./ChainError.ts"
import type { JsonRpcBatch, RpcFailure } from "./JsonRpc.ts"
import { signEip1559 } from "./TransactionSigning.ts"

/** A contract call one of the router's accounts makes: who signs it, which contract, what calldata. */
export interface OutgoingCall {
  readonly from: Address
  readonly to: Address
  readonly data: Hex
  /**
   * Calls of one gas class use about the same gas whatever their arguments (an x402 settlement to one
   * treasury: the same slots, warm or fresh alike), so one estimate plans the class's next calls for
   * `GAS_ESTIMATE_TTL_MS`, each checked by an `eth_call` instead of estimated (D530). Unset: every plan
   * estimates (a transfer to a recipient whose balance may be empty costs 17k gas more than one to a
   * funded one, so plain transfers never share an estimate).
   */
  readonly gasClass?: string | undefined
}

/** Gas limit and EIP-1559 fees for one transaction, fixed before it is signed. */
export interface GasPlan {
  readonly gas: bigint
  readonly maxFeePerGas: bigint
  readonly maxPriorityFeePerGas: bigint
}

/** A signed transaction: the exact bytes to (re)broadcast and the hash they always have. */
export interface SignedTransaction {
  readonly hash: Hash
  readonly raw: Hex
}

/** What the node says of a transaction hash. */
export type TransactionState =
  | { readonly _tag: "Mined"; readonly status: "success" | "reverted"; readonly blockNumber: bigint }
  /** In the node's pool, not yet in a block. */
  | { readonly _tag: "Pending" }
  /** Neither mined nor pooled: never received, dropped, or lost with the chain's state. */
  | { readonly _tag: "Unknown" }

/**
 * What a node did with raw bytes: took them (or already had them), or refused them because the sender's
 * nonce is already used on chain (by this very transaction, mined, or by another one).
 */
export type BroadcastResult = "accepted" | "nonceUsed"

/**
 * The low-level half of sending (`ledger/Treasury.ts` is the other): estimate, sign locally with a given
 * nonce, broadcast raw bytes, read a hash's state and an account's nonce. Nothing here picks a nonce.
 */
export interface OutgoingTransactions {
  /** Gas (with a margin) and fees for a call; fails `Reverted` when the call would revert now. */
  readonly plan: (call: OutgoingCall) => Effect.Effect<GasPlan, ChainError>
  /** Signs locally (no RPC); fails `Config` for an address the router holds no key for. */
  readonly sign: (
    call: OutgoingCall,
    plan: GasPlan,
    nonce: number
  ) => Effect.Effect<SignedTransaction, ChainError>
  readonly broadcast: (raw: Hex) => Effect.Effect<BroadcastResult, ChainError>
  readonly state: (hash: Hash) => Effect.Effect<TransactionState, ChainError>
  /** How many transactions of the account are mined (`latest`): the lowest nonce still free on chain. */
  readonly minedNonce: (address: Address) => Effect.Effect<number, ChainError>
  /** The newest block's number (`eth_blockNumber`), in the turn's batch like the looks it is read with. */
  readonly head: Effect.Effect<bigint, ChainError>
}

/** Gas estimates move with state between estimate and inclusion; a quarter more costs nothing unused. */
const GAS_MARGIN_PERCENT = 125n
/** A call planned from its class's estimate (not its own) gets half as much again (D530). */
const CLASS_GAS_MARGIN_PERCENT = 150n

/**
 * How long one gas estimate plans the calls of its class (D530). `eth_estimateGas` runs the call a dozen
 * times or more (a search over gas limits): on the embedded Anvil 3.1-3.2 ms of its CPU for an x402
 * settlement, against 0.6-0.7 ms for the one `eth_call` that checks the call would not revert.
 */
export const GAS_ESTIMATE_TTL_MS = 30_000

/**
 * How long one fee estimate serves every plan of the chain (docs/decisions.md D330). The signed ceiling is twice
 * the estimate, so an estimate this old is still far inside it; a node that refuses a transaction as underpriced
 * empties the cache, and the next plan asks again.
 */
export const FEE_ESTIMATE_TTL_MS = 1_500

export interface OutgoingOptions {
  /** Overrides `FEE_ESTIMATE_TTL_MS` (tests; 0 asks the node for every plan). */
  readonly feeTtlMs?: number
  /** Overrides `GAS_ESTIMATE_TTL_MS` (tests and benches; 0 estimates every plan). */
  readonly gasTtlMs?: number
}

interface FeeEstimate {
  readonly maxFeePerGas: bigint
  readonly maxPriorityFeePerGas: bigint
}

/** A node's refusal that says the fees were too low: the cached estimate is no longer to be trusted. */
const UNDERPRICED = /underpriced|fee too low|max fee per gas less than|fee cap less than|feecap/i
/** The node has these very bytes already (pooled or imported): as good as taken. */
const KNOWN = /already known|already imported|known transaction|already exists/i
/** The sender's nonce is used on chain (by this transaction, mined, or another one). */
const NONCE_USED = /nonce too low|nonce has already been used/i
const QUANTITY = /^0x[0-9a-fA-F]{1,64}$/

/**
 * A failed call as the chain's error: a revert (estimating a call that would revert) is `Reverted` with
 * the reason the node gives after "execution reverted:", as viem's errors were read (`ChainError.ts`);
 * anything else `Rpc`. The node's own message (never the URL: `JsonRpc.ts`) says what went wrong.
 */
const chainError = (operation: string) => (failure: RpcFailure) => {
  if (failure._tag === "Answered") {
    const reason = revertReason(failure.message)
    if (reason !== undefined || failure.code === 3) {
      return new ChainError({
        reason: "Reverted",
        message: `${operation} reverted: ${reason ?? "execution reverted"}`
      })
    }
  }
  return new ChainError({ reason: "Rpc", message: `${operation} failed: ${failure.message}` })
}

const quantityOf = (operation: string) => (result: unknown) =>
  typeof result === "string" && QUANTITY.test(result)
    ? Effect.succeed(BigInt(result))
    : Effect.fail(unreadable(operation))

/** viem's `estimateFeesPerGas` base-fee multiplier (1.2), in its integer arithmetic. */
const baseFeeCeiling = (baseFee: bigint) => (baseFee * 12n) / 10n

/**
 * The router's transactions over light, batched JSON-RPC (`JsonRpc.ts`, D485): the calls a settlement
 * pass makes in one turn (its plans, its broadcasts, its confirmations' looks) share one HTTP request.
 * Signing is local, in WebAssembly (`TransactionSigning.ts`, D486), with `keys` (the router's accounts;
 * read out of their `Redacted` once, here, and never logged). `rpc` bounds and retries each call
 * (`Connection.ts` `BACKGROUND_RPC`); a broadcast is sent once, as viem sent it: the treasury offers
 * recorded bytes again itself.
 */
export const makeOutgoing = (
  rpc: JsonRpcBatch,
  chainId: number,
  keys: ReadonlyArray<Redacted.Redacted<Hex>>,
  options: OutgoingOptions = {}
): OutgoingTransactions => {
  const keyOf = new Map(
    keys.map((key) => {
      const hex = Redacted.value(key)
      return [privateKeyToAddress(hex).toLowerCase(), Buffer.from(hex.slice(2), "hex")] as const
    })
  )
  const feeTtlMs = options.feeTtlMs ?? FEE_ESTIMATE_TTL_MS
  const gasTtlMs = options.gasTtlMs ?? GAS_ESTIMATE_TTL_MS

  // viem's eip1559 estimate: the latest block's base fee × 1.2 plus the node's suggested tip (or, from a
  // node without `eth_maxPriorityFeePerGas`, its gas price less the base fee). Block and tip in one batch.
  const freshFees = Effect.gen(function* () {
    const operation = "Outgoing.plan"
    const [baseFee, tip] = yield* Effect.all(
      [
        rpc.callWith("eth_getBlockByNumber", ["latest", false], {
          result: (block) => {
            const baseFee = (block as { baseFeePerGas?: unknown } | null)?.baseFeePerGas
            return typeof baseFee === "string" && QUANTITY.test(baseFee)
              ? Effect.succeed(BigInt(baseFee))
              : Effect.fail(
                  new ChainError({
                    reason: "Rpc",
                    message: `${operation} failed: the chain's blocks have no base fee (no EIP-1559)`
                  })
                )
          },
          failure: chainError(operation)
        }),
        rpc.call("eth_maxPriorityFeePerGas", []).pipe(Effect.flatMap(quantityOf(operation)), Effect.option)
      ],
      { concurrency: 2 }
    )
    const maxPriorityFeePerGas =
      tip._tag === "Some"
        ? tip.value
        : yield* rpc
            .callWith("eth_gasPrice", [], { result: quantityOf(operation), failure: chainError(operation) })
            .pipe(Effect.map((gasPrice) => (gasPrice > baseFee ? gasPrice - baseFee : 0n)))
    return { maxFeePerGas: baseFeeCeiling(baseFee) + maxPriorityFeePerGas, maxPriorityFeePerGas }
  })

  // The chain's last fee estimate and when it was asked for (Clock time); undefined: ask the node. Plans
  // that find it stale while an ask is under way wait for that ask (a settlement pass plans together).
  let cachedFees: { readonly at: number; readonly fees: FeeEstimate } | undefined
  let asking: Deferred.Deferred<FeeEstimate, ChainError> | undefined
  const feeEstimate = Effect.gen(function* () {
    const asked = yield* Clock.currentTimeMillis
    const cached = cachedFees
    if (cached !== undefined && asked - cached.at < feeTtlMs && asked >= cached.at) return cached.fees
    // The ask is made, shared and started in one uninterruptible step, and runs to its end whatever
    // happens to the asker (bounded by the transport's timeout and retries): the plans waiting on it get
    // its answer even if the asker is interrupted, and `asking` never names an ask that will not end.
    // Only the waits can be interrupted.
    return yield* Effect.uninterruptibleMask((restore) => {
      if (asking !== undefined) return restore(Deferred.await(asking))
      const answer = Deferred.makeUnsafe<FeeEstimate, ChainError>()
      asking = answer
      return Deferred.into(
        freshFees.pipe(
          Effect.tap((fees) =>
            Effect.sync(() => {
              cachedFees = { at: asked, fees }
            })
          ),
          Effect.ensuring(
            Effect.sync(() => {
              if (asking === answer) asking = undefined
            })
          )
        ),
        answer
      ).pipe(Effect.andThen(restore(Deferred.await(answer))))
    })
  })

  // Each gas class's estimate (raw, no margin) and when it was kept (Clock time): the lowest estimate made
  // while it is fresh, so one costly call (a payer whose check costs more) does not raise the class's limit.
  const classGas = new Map<string, { readonly at: number; readonly gas: bigint }>()
  const fresh = (
    kept: { readonly at: number } | undefined,
    now: number
  ): kept is { at: number; gas: bigint } => kept !== undefined && now >= kept.at && now - kept.at < gasTtlMs

  /** The call's own estimate, with its margin; kept for its class, if it has one. */
  const estimated = (call: OutgoingCall) =>
    rpc
      .callWith("eth_estimateGas", [{ from: call.from, to: call.to, data: call.data }], {
        result: quantityOf("Outgoing.plan"),
        failure: chainError("Outgoing.plan")
      })
      .pipe(
        Effect.flatMap((gas) =>
          call.gasClass === undefined
            ? Effect.succeed(gas)
            : Effect.map(Clock.currentTimeMillis, (now) => {
                const kept = classGas.get(call.gasClass!)
                if (!fresh(kept, now) || gas < kept.gas) classGas.set(call.gasClass!, { at: now, gas })
                return gas
              })
        ),
        Effect.map((gas) => (gas * GAS_MARGIN_PERCENT) / 100n)
      )

  /**
   * The gas a call is planned with: its class's limit while the class's estimate is fresh, once an
   * `eth_call` run under exactly that limit, against the latest block, succeeds; else (no fresh estimate,
   * or the call failed under the limit for any reason: a revert, gas the limit does not cover, as a payer
   * whose signature check costs more would need) the call's own estimate, which fails `Reverted` with the
   * token's reason when the call would revert whatever its gas.
   */
  const gasFor = (call: OutgoingCall) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const kept = call.gasClass === undefined ? undefined : classGas.get(call.gasClass)
      if (!fresh(kept, now)) return estimated(call)
      const limit = (kept.gas * CLASS_GAS_MARGIN_PERCENT) / 100n
      return rpc
        .callWith(
          "eth_call",
          // `latest`, not `pending` (D532): a node answers a call at `pending` by first running every pooled
          // transaction on top of the latest block, so under load each check re-ran the block being built
          // (on the embedded Anvil 60% of its CPU). A payer's own pooled settlements are still counted in
          // `x402_outstanding` against its balance, and the class's half-again margin covers the payee's first
          // credit; a transfer the pool would make revert (a nonce someone else pooled) is now mined reverted,
          // costing its gas, where the plan refused it; what follows is the same and no money moves.
          [{ from: call.from, to: call.to, data: call.data, gas: `0x${limit.toString(16)}` }, "latest"],
          { result: () => Effect.void, failure: chainError("Outgoing.plan") }
        )
        .pipe(
          Effect.as(limit),
          Effect.catch(() => estimated(call))
        )
    })

  const plan = (call: OutgoingCall) =>
    Effect.map(
      Effect.all([gasFor(call), feeEstimate], { concurrency: 2 }),
      ([gas, fees]): GasPlan => ({
        gas,
        // A ceiling, not a price: the base fee actually paid is the block's. Twice the estimate rides out
        // several full blocks of base-fee growth before a signed transaction could get stuck (D169).
        maxFeePerGas: fees.maxFeePerGas * 2n,
        maxPriorityFeePerGas: fees.maxPriorityFeePerGas
      })
    )

  const sign = (call: OutgoingCall, gasPlan: GasPlan, nonce: number) =>
    Effect.suspend(() => {
      const key = keyOf.get(call.from.toLowerCase())
      if (key === undefined) {
        return Effect.fail(new ChainError({ reason: "Config", message: `no signing key for ${call.from}` }))
      }
      return Effect.try({
        try: (): SignedTransaction =>
          signEip1559(
            {
              chainId,
              nonce,
              to: call.to,
              data: call.data,
              gas: gasPlan.gas,
              maxFeePerGas: gasPlan.maxFeePerGas,
              maxPriorityFeePerGas: gasPlan.maxPriorityFeePerGas
            },
            key
          ),
        catch: () => new ChainError({ reason: "Invalid", message: "Outgoing.sign: unsignable transaction" })
      })
    })

  const broadcast = (raw: Hex) =>
    rpc
      .callWith(
        "eth_sendRawTransaction",
        [raw],
        {
          result: () => Effect.succeed<BroadcastResult>("accepted"),
          failure: (failure) => failure
        },
        { retry: false }
      )
      .pipe(
        Effect.catch((failure) => {
          if (failure._tag === "Answered") {
            if (KNOWN.test(failure.message)) return Effect.succeed<BroadcastResult>("accepted")
            if (NONCE_USED.test(failure.message)) return Effect.succeed<BroadcastResult>("nonceUsed")
            // Refused for its fees: the recorded bytes stay as they are (rebroadcast, never replaced), but
            // the next plan asks the node for a fresh estimate.
            if (UNDERPRICED.test(failure.message)) cachedFees = undefined
          }
          return Effect.fail(chainError("Outgoing.broadcast")(failure))
        })
      )

  /**
   * The receipt's outcome, or undefined while the node has none. Only a JSON `null` says "none": an
   * answer without a result is unreadable, never "not found" (the treasury would void the record).
   */
  const receipt = (hash: Hash) =>
    rpc.callWith("eth_getTransactionReceipt", [hash], {
      result: (found) => {
        if (found === null) return Effect.succeed(undefined)
        if (typeof found !== "object") return Effect.fail(unreadable("Outgoing.state"))
        const { status, blockNumber } = found as { status?: unknown; blockNumber?: unknown }
        if (blockNumber === null) return Effect.succeed(undefined)
        return typeof blockNumber === "string" &&
          QUANTITY.test(blockNumber) &&
          typeof status === "string" &&
          QUANTITY.test(status)
          ? Effect.succeed({
              status: BigInt(status) === 1n ? ("success" as const) : ("reverted" as const),
              blockNumber: BigInt(blockNumber)
            })
          : Effect.fail(unreadable("Outgoing.state"))
      },
      failure: chainError("Outgoing.state")
    })

  const state = (hash: Hash) =>
    Effect.gen(function* () {
      const mined = yield* receipt(hash)
      if (mined !== undefined) return { _tag: "Mined", ...mined } satisfies TransactionState
      // `null`: neither pooled nor mined; an object: pooled (`blockNumber` null) or mined since the receipt
      // was read; anything else (no result at all) is no answer.
      const found = yield* rpc.callWith("eth_getTransactionByHash", [hash], {
        result: (found) =>
          found === null
            ? Effect.succeed("unknown" as const)
            : typeof found === "object"
              ? Effect.succeed(
                  (found as { blockNumber?: unknown }).blockNumber == null
                    ? ("pooled" as const)
                    : ("mined" as const)
                )
              : Effect.fail(unreadable("Outgoing.state")),
        failure: chainError("Outgoing.state")
      })
      if (found === "pooled") return { _tag: "Pending" } as const
      // Mined between the two reads: the receipt is there now (only a receipt says how it ended).
      if (found === "mined") {
        const late = yield* Effect.option(receipt(hash))
        if (late._tag === "Some" && late.value !== undefined) return { _tag: "Mined", ...late.value } as const
        return { _tag: "Pending" } as const
      }
      return { _tag: "Unknown" } as const
    })

  const minedNonce = (address: Address) =>
    rpc.callWith("eth_getTransactionCount", [address, "latest"], {
      result: (count) => Effect.map(quantityOf("Outgoing.minedNonce")(count), Number),
      failure: chainError("Outgoing.minedNonce")
    })

  const head = rpc.callWith("eth_blockNumber", [], {
    result: quantityOf("Chain.blockNumber"),
    failure: chainError("Chain.blockNumber")
  })

  return { plan, sign, broadcast, state, minedNonce, head }
}
