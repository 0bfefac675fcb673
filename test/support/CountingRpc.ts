import { Redacted } from "effect"
import type { Hex } from "viem"
import type { ChainShape } from "../../src/chain/Chain.ts"
import { BACKGROUND_RPC } from "../../src/chain/Connection.ts"
import { privateKeyOf, routerSignerAccount, treasuryAccount } from "../../src/chain/DevAccounts.ts"
import { httpPost, makeJsonRpcBatch, type PostJson } from "../../src/chain/JsonRpc.ts"
import { makeOutgoing, type OutgoingOptions } from "../../src/chain/Outgoing.ts"

interface Call {
  readonly id: number
  readonly method: string
  readonly params: ReadonlyArray<unknown>
}

/**
 * The node over HTTP as the router's background calls reach it (`BACKGROUND_RPC`), with every HTTP request
 * and the JSON-RPC methods it carried recorded, and a way to answer a method with an error of the test's
 * choosing instead of asking the node.
 */
export const countingRpc = (rpcUrl: string) => {
  const requests: Array<ReadonlyArray<string>> = []
  const sent: Array<Call> = []
  const refusals = new Map<string, { readonly code: number; readonly message: string }>()
  const post = httpPost(rpcUrl, BACKGROUND_RPC.timeout)
  const counted: PostJson = (body) => {
    const calls = JSON.parse(body) as ReadonlyArray<Call>
    requests.push(calls.map((call) => call.method))
    sent.push(...calls)
    if (calls.every((call) => refusals.has(call.method))) {
      return Promise.resolve({
        status: 200,
        body: JSON.stringify(
          calls.map((call) => ({ jsonrpc: "2.0", id: call.id, error: refusals.get(call.method) }))
        )
      })
    }
    return post(body)
  }
  return {
    rpc: makeJsonRpcBatch(counted, { retries: BACKGROUND_RPC.retryCount }),
    /** Each HTTP request's methods, in order. */
    requests,
    methods: () => requests.flat(),
    /** The params of every call of `method`, in order. */
    paramsOf: (method: string) => sent.filter((call) => call.method === method).map((call) => call.params),
    /** From now on a request made only of `method` calls is answered with `error` (undefined: asks again). */
    refuse: (method: string, error: { readonly code: number; readonly message: string } | undefined) => {
      if (error === undefined) refusals.delete(method)
      else refusals.set(method, error)
    }
  }
}

/** The embedded chain's own signing keys (dev accounts: public knowledge). */
export const embeddedKeys: ReadonlyArray<Redacted.Redacted<Hex>> = [
  routerSignerAccount(),
  treasuryAccount()
].map((account) => Redacted.make(privateKeyOf(account)))

/**
 * The embedded chain's service with its outgoing transactions sent through `countingRpc`: what the
 * treasury sends, counted. Provide it as `Chain` to a `Treasury.make()`.
 */
export const countedChain = (chain: ChainShape, options: OutgoingOptions = {}) => {
  const counting = countingRpc(chain.rpcUrl)
  const counted: ChainShape = {
    ...chain,
    outgoing: makeOutgoing(counting.rpc, chain.chainId, embeddedKeys, options)
  }
  return { ...counting, chain: counted }
}
