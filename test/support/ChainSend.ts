import { Effect, Semaphore } from "effect"
import type { Hash } from "viem"
import type { ChainError, ChainShape, OutgoingCall, TransferAuthorization } from "../../src/chain/Chain.ts"

const oneAtATime = Semaphore.makeUnsafe(1)

/**
 * Sends one call of the router's accounts straight to the chain, for tests of the chain and the contracts
 * alone (no database, so no treasury): the same estimate, local signature and raw broadcast the treasury
 * uses, with the node's pending count as the nonce, one send at a time. The router itself sends only
 * through `ledger/Treasury.ts`.
 */
export const sendNow = (
  chain: ChainShape,
  call: OutgoingCall | Effect.Effect<OutgoingCall, ChainError>
): Effect.Effect<Hash, ChainError> =>
  oneAtATime.withPermit(
    Effect.gen(function* () {
      const resolved = Effect.isEffect(call) ? yield* call : call
      const plan = yield* chain.outgoing.plan(resolved)
      const nonce = yield* Effect.promise(() =>
        chain.publicClient.getTransactionCount({ address: resolved.from, blockTag: "pending" })
      )
      const signed = yield* chain.outgoing.sign(resolved, plan, nonce)
      yield* chain.outgoing.broadcast(signed.raw)
      return signed.hash
    })
  )

/** An x402 `exact` authorization submitted by the router signer, as `sendNow`. */
export const submit = (chain: ChainShape, authorization: TransferAuthorization) =>
  sendNow(chain, chain.calls.transferWithAuthorization(authorization))

/** A raw JSON-RPC call to the node (Anvil's own methods: `evm_setAutomine`, `evm_mine`, `anvil_mine`, ...). */
export const nodeCall = (chain: ChainShape, method: string, params: ReadonlyArray<unknown> = []) =>
  Effect.promise(() => chain.publicClient.request({ method, params } as never))
