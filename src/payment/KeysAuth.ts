import { createHash } from "node:crypto"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { type Hex, hashMessage, isHex, verifyMessage } from "viem"
import { Unauthorized } from "../domain/Errors.ts"

/** A wallet signature is accepted this many seconds either side of the router clock, once. */
export const KEYS_SIGNATURE_WINDOW_S = 300

export const sha256Hex = (text: string) => createHash("sha256").update(text, "utf8").digest("hex")

export interface KeysRequestParts {
  readonly method: string
  /** The request path without the query string, exactly as sent. */
  readonly path: string
  readonly timestamp: string
  /** The raw request body ("" when there is none). */
  readonly body: string
}

/** The exact EIP-191 message a wallet signs for `x-keys-sig` (docs/protocol.md section 4). */
export const keysMessage = (parts: KeysRequestParts) =>
  [
    "svc keys request",
    `method: ${parts.method.toUpperCase()}`,
    `path: ${parts.path}`,
    `timestamp: ${parts.timestamp}`,
    `body-sha256: ${sha256Hex(parts.body)}`
  ].join("\n")

export interface KeysRequest extends KeysRequestParts {
  readonly wallet: string | undefined
  readonly signature: string | undefined
}

export interface KeysSignature {
  /** The signing wallet, lowercase. */
  readonly wallet: string
  /** What makes the request unique: the digest of the signed message (replay guard key). */
  readonly replayKey: string
  readonly expiresAt: number
}

const refuse = (message: string) => new Unauthorized({ code: "invalid_wallet_signature", message })

/**
 * Checks everything but replay: header shapes, the clock window and the signature. Pure but for the
 * signature recovery, so the test vector is checked without a database.
 */
export const checkKeysSignature = Effect.fn("KeysAuth.check")(function* (
  request: KeysRequest,
  nowSeconds: number
) {
  const { wallet, signature, timestamp } = request
  if (wallet === undefined || !/^0x[0-9a-fA-F]{40}$/.test(wallet)) {
    return yield* refuse("x-keys-wallet must be a 0x-prefixed 20-byte address")
  }
  if (!/^\d{1,12}$/.test(timestamp)) {
    return yield* refuse("x-keys-timestamp must be unix seconds")
  }
  const ts = Number(timestamp)
  if (Math.abs(nowSeconds - ts) > KEYS_SIGNATURE_WINDOW_S) {
    return yield* refuse(`x-keys-timestamp must be within ${KEYS_SIGNATURE_WINDOW_S} s of the router clock`)
  }
  if (signature === undefined || !isHex(signature) || signature.length < 132) {
    return yield* refuse("x-keys-sig must be a 0x-prefixed 65-byte signature")
  }
  const message = keysMessage(request)
  const valid = yield* Effect.tryPromise(() =>
    verifyMessage({ address: wallet as Hex, message, signature: signature as Hex })
  ).pipe(Effect.orElseSucceed(() => false))
  if (!valid) {
    return yield* refuse("x-keys-sig is not a signature by x-keys-wallet over this request")
  }
  return {
    wallet: wallet.toLowerCase(),
    replayKey: sha256Hex(hashMessage(message)),
    expiresAt: ts + KEYS_SIGNATURE_WINDOW_S
  } satisfies KeysSignature
})

/**
 * Wallet-signed key management (`x-keys-wallet`, `x-keys-timestamp`, `x-keys-sig`). A signature is
 * accepted once: its message digest goes into `keys_signatures`, and a second request carrying the
 * same signed message (however its signature is encoded) is refused.
 */
export class KeysAuth extends Context.Service<
  KeysAuth,
  {
    /** The signing wallet (lowercase) of an accepted request. */
    readonly verify: (request: KeysRequest) => Effect.Effect<string, Unauthorized>
  }
>()("router/payment/KeysAuth") {
  static readonly layer = Layer.effect(
    KeysAuth,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient

      const verify = Effect.fn("KeysAuth.verify")(function* (request: KeysRequest) {
        const nowSeconds = Math.floor((yield* Clock.currentTimeMillis) / 1000)
        const accepted = yield* checkKeysSignature(request, nowSeconds)
        // Expired guards are swept by the same statement, so the table stays at one window's size.
        const inserted = yield* sql<{ sig_hash: string }>`
          WITH swept AS (DELETE FROM keys_signatures WHERE expires_at < to_timestamp(${nowSeconds - 60}))
          INSERT INTO keys_signatures (sig_hash, wallet, expires_at)
          VALUES (${accepted.replayKey}, ${accepted.wallet}, to_timestamp(${accepted.expiresAt}))
          ON CONFLICT (sig_hash) DO NOTHING
          RETURNING sig_hash
        `.pipe(Effect.orDie)
        if (inserted.length === 0) {
          return yield* refuse("this signed request was already used; sign again with a new timestamp")
        }
        return accepted.wallet
      })

      return KeysAuth.of({ verify })
    })
  )
}
