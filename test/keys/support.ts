import { Effect } from "effect"
import type { PrivateKeyAccount } from "viem/accounts"
import { keysMessage } from "../../src/payment/KeysAuth.ts"
import { call, OPERATOR_TOKEN, postJson } from "../support/Router.ts"

// Signatures are deterministic: two identical requests in one second would be one signed message (a
// replay), so each call signs a different second inside the accepted window.
let seq = 0
const freshTimestamp = () => Math.floor(Date.now() / 1000) - (seq++ % 200)

export interface SignOptions {
  /** Unix seconds; defaults to a fresh second within the window. */
  readonly timestamp?: number
  /** Sign this body but send `body` (tamper tests). */
  readonly signedBody?: string
  /** Claim this wallet in `x-keys-wallet` instead of the signer's. */
  readonly claimedWallet?: string
}

/** The three `x-keys-*` headers for a request, signed by `account`. */
export const keysHeaders = (
  account: PrivateKeyAccount,
  method: string,
  path: string,
  body: string,
  options: SignOptions = {}
) =>
  Effect.promise(async () => {
    const timestamp = String(options.timestamp ?? freshTimestamp())
    const message = keysMessage({ method, path, timestamp, body: options.signedBody ?? body })
    return {
      "x-keys-wallet": options.claimedWallet ?? account.address,
      "x-keys-timestamp": timestamp,
      "x-keys-sig": await account.signMessage({ message })
    }
  })

/** A wallet-signed call, as a key-management client makes it. */
export const signedCall = (
  account: PrivateKeyAccount,
  method: "GET" | "POST" | "DELETE",
  path: string,
  body?: unknown,
  options: SignOptions = {}
) =>
  Effect.gen(function* () {
    const text = body === undefined ? "" : JSON.stringify(body)
    const headers = yield* keysHeaders(account, method, path, text, options)
    return yield* call(path, {
      method,
      headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      ...(body === undefined ? {} : { body: text })
    })
  })

export const invite = (wallet: string, invited = true) =>
  postJson("/v1/admin/wallets", { wallet, invited }, { authorization: `Bearer ${OPERATOR_TOKEN}` })

export interface CreatedKey {
  readonly id: string
  readonly key: string
  readonly kind: "credit" | "api"
  readonly budget: number
  readonly budget_usdc: string
}

export const createKey = (account: PrivateKeyAccount, body: Record<string, unknown>) =>
  Effect.map(signedCall(account, "POST", "/v1/keys", body), (reply) => {
    if (reply.status !== 201) throw new Error(`key creation failed: ${reply.status} ${reply.text}`)
    return reply.json as CreatedKey
  })

export const errorCode = (json: unknown) => (json as { error?: { code?: string } }).error?.code

export interface BalanceView {
  readonly wallet: string
  readonly available: number
  readonly reserved: number
  readonly pending: number
  readonly available_usdc: string
}

export const balanceWith = (creditKey: string) =>
  call("/v1/credits/balance", { headers: { "x-credit-key": creditKey } })
