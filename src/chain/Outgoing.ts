import { Clock, Effect } from "effect"
import {
  type Address,
  BaseError,
  type Hash,
  type Hex,
  type HttpTransport,
  isAddressEqual,
  keccak256,
  type LocalAccount,
  NonceTooLowError,
  type PublicClient,
  TransactionNotFoundError,
  TransactionReceiptNotFoundError,
  type Chain as ViemChain
} from "viem"
import { ChainError, fromViemError } from "./ChainError.ts"

/** A contract call one of the router's accounts makes: who signs it, which contract, what calldata. */
export interface OutgoingCall {
  readonly from: Address
  readonly to: Address
  readonly data: Hex
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
}

/** Gas estimates move with state between estimate and inclusion; a quarter more costs nothing unused. */
const GAS_MARGIN_PERCENT = 125n

/**
 * How long one fee estimate serves every plan of the chain (docs/decisions.md D330). The signed ceiling is twice
 * the estimate, so an estimate this old is still far inside it; a node that refuses a transaction as underpriced
 * empties the cache, and the next plan asks again.
 */
export const FEE_ESTIMATE_TTL_MS = 1_500

export interface OutgoingOptions {
  /** Overrides `FEE_ESTIMATE_TTL_MS` (tests; 0 asks the node for every plan). */
  readonly feeTtlMs?: number
}

interface FeeEstimate {
  readonly maxFeePerGas: bigint
  readonly maxPriorityFeePerGas: bigint
}

/** A node's refusal that says the fees were too low: the cached estimate is no longer to be trusted. */
const isUnderpricedError = (error: unknown) =>
  error instanceof BaseError &&
  /underpriced|fee too low|max fee per gas less than|fee cap less than|feecap/i.test(
    `${error.shortMessage} ${error.details ?? ""}`
  )

const isKnownError = (error: unknown) =>
  error instanceof BaseError &&
  /already known|already imported|known transaction|already exists/i.test(
    `${error.shortMessage} ${error.details ?? ""}`
  )

const isNonceUsedError = (error: unknown) =>
  error instanceof BaseError &&
  (error.walk((e) => e instanceof NonceTooLowError) !== null ||
    /nonce too low|nonce has already been used/i.test(`${error.shortMessage} ${error.details ?? ""}`))

const isNotFound = (error: unknown) =>
  error instanceof BaseError &&
  error.walk((e) => e instanceof TransactionNotFoundError || e instanceof TransactionReceiptNotFoundError) !==
    null

export const makeOutgoing = (
  client: PublicClient<HttpTransport, ViemChain>,
  chainId: number,
  accounts: ReadonlyArray<LocalAccount>,
  options: OutgoingOptions = {}
): OutgoingTransactions => {
  const accountOf = (address: Address) => accounts.find((account) => isAddressEqual(account.address, address))
  const feeTtlMs = options.feeTtlMs ?? FEE_ESTIMATE_TTL_MS

  // The chain's last fee estimate and when it was asked for (Clock time); undefined: ask the node.
  let cachedFees: { readonly at: number; readonly fees: FeeEstimate } | undefined
  const freshFees = Effect.tryPromise({
    try: () => client.estimateFeesPerGas({ type: "eip1559" }),
    catch: fromViemError("Outgoing.plan")
  })
  const feeEstimate = Effect.gen(function* () {
    const asked = yield* Clock.currentTimeMillis
    const cached = cachedFees
    if (cached !== undefined && asked - cached.at < feeTtlMs && asked >= cached.at) return cached.fees
    const fees = yield* freshFees
    cachedFees = { at: asked, fees }
    return fees
  })

  const plan = (call: OutgoingCall) =>
    Effect.gen(function* () {
      const [gas, fees] = yield* Effect.all(
        [
          Effect.tryPromise({
            try: () => client.estimateGas({ account: call.from, to: call.to, data: call.data }),
            catch: fromViemError("Outgoing.plan")
          }),
          feeEstimate
        ],
        { concurrency: 2 }
      )
      return {
        gas: (gas * GAS_MARGIN_PERCENT) / 100n,
        // A ceiling, not a price: the base fee actually paid is the block's. Twice the estimate rides out
        // several full blocks of base-fee growth before a signed transaction could get stuck (D169).
        maxFeePerGas: fees.maxFeePerGas * 2n,
        maxPriorityFeePerGas: fees.maxPriorityFeePerGas
      } satisfies GasPlan
    })

  const sign = (call: OutgoingCall, gasPlan: GasPlan, nonce: number) =>
    Effect.gen(function* () {
      const account = accountOf(call.from)
      if (account?.signTransaction === undefined) {
        return yield* new ChainError({ reason: "Config", message: `no signing key for ${call.from}` })
      }
      const signTransaction = account.signTransaction
      const raw = yield* Effect.tryPromise({
        try: () =>
          signTransaction({
            type: "eip1559",
            chainId,
            to: call.to,
            data: call.data,
            value: 0n,
            nonce,
            gas: gasPlan.gas,
            maxFeePerGas: gasPlan.maxFeePerGas,
            maxPriorityFeePerGas: gasPlan.maxPriorityFeePerGas
          }),
        catch: fromViemError("Outgoing.sign")
      })
      return { raw, hash: keccak256(raw) } satisfies SignedTransaction
    })

  const broadcast = (raw: Hex) =>
    Effect.tryPromise({
      try: () => client.sendRawTransaction({ serializedTransaction: raw }),
      catch: (error) => error
    }).pipe(
      Effect.as<BroadcastResult>("accepted"),
      Effect.catch((error) => {
        if (isKnownError(error)) return Effect.succeed<BroadcastResult>("accepted")
        if (isNonceUsedError(error)) return Effect.succeed<BroadcastResult>("nonceUsed")
        // Refused for its fees: the recorded bytes stay as they are (rebroadcast, never replaced), but the
        // next plan asks the node for a fresh estimate.
        if (isUnderpricedError(error)) cachedFees = undefined
        return Effect.fail(fromViemError("Outgoing.broadcast")(error))
      })
    )

  const state = (hash: Hash) =>
    Effect.gen(function* () {
      const receipt = yield* Effect.tryPromise({
        try: () => client.getTransactionReceipt({ hash }),
        catch: (error) => error
      }).pipe(
        Effect.map((r) => ({ status: r.status, blockNumber: r.blockNumber })),
        Effect.catch((error) =>
          isNotFound(error) ? Effect.succeed(undefined) : Effect.fail(fromViemError("Outgoing.state")(error))
        )
      )
      if (receipt !== undefined) return { _tag: "Mined", ...receipt } satisfies TransactionState
      const pooled = yield* Effect.tryPromise({
        try: () => client.getTransaction({ hash }),
        catch: (error) => error
      }).pipe(
        Effect.as(true),
        Effect.catch((error) =>
          isNotFound(error) ? Effect.succeed(false) : Effect.fail(fromViemError("Outgoing.state")(error))
        )
      )
      // Mined between the two reads: the receipt is there now.
      if (pooled) {
        const late = yield* Effect.tryPromise({
          try: () => client.getTransactionReceipt({ hash }),
          catch: (error) => error
        }).pipe(Effect.option)
        if (late._tag === "Some") {
          return { _tag: "Mined", status: late.value.status, blockNumber: late.value.blockNumber } as const
        }
        return { _tag: "Pending" } as const
      }
      return { _tag: "Unknown" } as const
    })

  const minedNonce = (address: Address) =>
    Effect.tryPromise({
      try: () => client.getTransactionCount({ address, blockTag: "latest" }),
      catch: fromViemError("Outgoing.minedNonce")
    })

  return { plan, sign, broadcast, state, minedNonce }
}
