import { Context, Effect, Layer, Schema } from "effect"
import { SqlClient, type SqlError } from "effect/sql"
import type { Hex } from "viem"
import { Chain } from "../chain/Chain.ts"
import { feeSplit } from "../domain/Billing.ts"
import { ReceiptBody, receiptTypedData } from "./Receipt.ts"

export class NonceReplay extends Schema.TaggedError<NonceReplay>()("NonceReplay", { payer: Schema.String }) {}

export interface ReservationRecord {
  readonly requestId: string
  readonly dialect: string
  readonly payer: string
  readonly requestedModel: string
  readonly modelClass: string
  readonly providerId: string
  readonly authorized: number
  readonly agent: Record<string, string>
}

export interface X402Hold {
  readonly nonce: Hex
  readonly validAfter: bigint
  readonly validBefore: bigint
  readonly signature: Hex
}

export interface CaptureRecord {
  readonly receipt: ReceiptBody
  readonly economics: unknown
}

const decodeReceipt = Schema.decodeUnknownEffect(ReceiptBody)

const isUniqueViolation = (error: SqlError.SqlError) => error.reason._tag === "UniqueViolation"

/**
 * The book of record for paid requests. Every movement of money is an append-only
 * `ledger_entries` row written in the same transaction as the state it changes.
 */
export class Ledger extends Context.Service<
  Ledger,
  {
    /** Reserves an x402 authorization for a request; a nonce seen before fails `NonceReplay`. */
    readonly reserveX402: (record: ReservationRecord, hold: X402Hold) => Effect.Effect<void, NonceReplay>
    readonly nonceUnused: (payer: string, nonce: Hex) => Effect.Effect<boolean>
    /** Captures the metered charge: receipt (pending settlement), economics, fee split, refund due. */
    readonly capture: (record: CaptureRecord) => Effect.Effect<void>
    /** Nothing was served: the whole reservation is released and no money moves. */
    readonly release: (record: CaptureRecord) => Effect.Effect<void>
    /** Signs and stores the receipt as final with the given settlement facts. */
    readonly finalizeReceipt: (
      requestId: string,
      patch: Partial<Pick<ReceiptBody, "payment_ref" | "settlement" | "refund_ref">>
    ) => Effect.Effect<void>
    readonly receipt: (
      requestId: string
    ) => Effect.Effect<
      { readonly body: ReceiptBody; readonly signature: string | null; readonly final: boolean } | undefined
    >
    readonly economics: (requestId: string) => Effect.Effect<unknown | undefined>
  }
>()("router/ledger/Ledger") {
  static readonly layer = Layer.effect(
    Ledger,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const chain = yield* Chain

      const entry = (
        requestId: string,
        account: string,
        kind: string,
        amount: number,
        ref: string | null = null
      ) =>
        amount > 0
          ? sql`INSERT INTO ledger_entries (request_id, account, kind, amount, ref)
                VALUES (${requestId}, ${account}, ${kind}, ${amount}, ${ref})`
          : Effect.void

      /**
       * One statement, one round trip, on the first-byte path: the request, its authorization
       * and the ledger row land together or not at all. A (payer, nonce) seen before violates
       * the primary key and the whole statement fails: a replay never reserves anything.
       */
      const reserveX402 = Effect.fn("Ledger.reserveX402")(function* (
        record: ReservationRecord,
        hold: X402Hold
      ) {
        const payer = record.payer.toLowerCase()
        yield* sql`
          WITH request AS (
            INSERT INTO requests (request_id, dialect, payment_kind, payer, requested_model, model_class,
                                  provider_id, authorized, status, agent)
            VALUES (${record.requestId}, ${record.dialect}, 'x402', ${payer}, ${record.requestedModel},
                    ${record.modelClass}, ${record.providerId}, ${record.authorized}, 'reserved',
                    ${JSON.stringify(record.agent)}::jsonb)
            RETURNING request_id
          ), hold AS (
            INSERT INTO x402_authorizations (payer, nonce, request_id, value, valid_after, valid_before,
                                             signature, status)
            SELECT ${payer}, ${hold.nonce.toLowerCase()}, request_id, ${record.authorized},
                   ${hold.validAfter.toString()}, ${hold.validBefore.toString()}, ${hold.signature}, 'reserved'
            FROM request
            RETURNING request_id
          )
          INSERT INTO ledger_entries (request_id, account, kind, amount)
          SELECT request_id, ${payer}, 'authorization_reserved', ${record.authorized} FROM hold
        `.pipe(
          Effect.catchTag("SqlError", (error) =>
            isUniqueViolation(error) ? Effect.fail(new NonceReplay({ payer })) : Effect.die(error)
          )
        )
      })

      const nonceUnused = (payer: string, nonce: Hex) =>
        sql<{ n: number }>`
          SELECT count(*)::int AS n FROM x402_authorizations
          WHERE payer = ${payer.toLowerCase()} AND nonce = ${nonce.toLowerCase()}
        `.pipe(
          Effect.map((rows) => rows[0]?.n === 0),
          Effect.orDie
        )

      const storeReceipt = (receipt: ReceiptBody, economics: unknown) =>
        Effect.all([
          sql`INSERT INTO receipts (request_id, epoch_id, body) VALUES (${receipt.request_id}, ${receipt.epoch_id},
                ${JSON.stringify(receipt)}::jsonb)`,
          sql`INSERT INTO economics (request_id, body) VALUES (${receipt.request_id}, ${JSON.stringify(economics)}::jsonb)`
        ])

      const capture = Effect.fn("Ledger.capture")(function* ({ receipt, economics }: CaptureRecord) {
        const { routerFee, providerShare } = feeSplit(receipt.charged)
        const refund = receipt.authorized - receipt.charged
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`
                UPDATE requests SET charged = ${receipt.charged}, status = 'captured', finished_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
              `
              yield* sql`
                UPDATE x402_authorizations SET status = 'pending', updated_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
              `
              yield* entry(receipt.request_id, receipt.wallet, "capture", receipt.charged)
              yield* entry(receipt.request_id, "router", "router_fee", routerFee)
              yield* entry(
                receipt.request_id,
                `provider:${receipt.provider_id}`,
                "provider_share",
                providerShare
              )
              if (refund > 0) {
                yield* entry(receipt.request_id, receipt.wallet, "refund_due", refund)
                yield* sql`
                  INSERT INTO refunds (request_id, payer, amount, epoch_id, status)
                  VALUES (${receipt.request_id}, ${receipt.wallet}, ${refund}, ${receipt.epoch_id}, 'due')
                `
              }
              yield* storeReceipt(receipt, economics)
            })
          )
          .pipe(Effect.orDie)
      })

      const sign = (receipt: ReceiptBody) => chain.signTypedData(receiptTypedData(receipt, chain.chainId))

      const release = Effect.fn("Ledger.release")(function* ({ receipt, economics }: CaptureRecord) {
        const signature = yield* Effect.orDie(sign(receipt))
        yield* sql
          .withTransaction(
            Effect.gen(function* () {
              yield* sql`
                UPDATE requests SET charged = 0, status = 'released', finished_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
              `
              // The authorization is never submitted; its signature is erased.
              yield* sql`
                UPDATE x402_authorizations SET status = 'released', signature = NULL, updated_at = now()
                WHERE request_id = ${receipt.request_id} AND status = 'reserved'
              `
              yield* entry(receipt.request_id, receipt.wallet, "authorization_released", receipt.authorized)
              yield* storeReceipt(receipt, economics)
              yield* sql`UPDATE receipts SET signature = ${signature}, final = true WHERE request_id = ${receipt.request_id}`
            })
          )
          .pipe(Effect.orDie)
      })

      const readReceipt = (requestId: string) =>
        sql<{ body: unknown; signature: string | null; final: boolean }>`
          SELECT body, signature, final FROM receipts WHERE request_id = ${requestId}
        `.pipe(
          Effect.flatMap((rows) =>
            rows[0] === undefined
              ? Effect.succeed(undefined)
              : Effect.map(decodeReceipt(rows[0].body), (body) => ({
                  body,
                  signature: rows[0]!.signature,
                  final: rows[0]!.final
                }))
          ),
          Effect.orDie
        )

      const finalizeReceipt = Effect.fn("Ledger.finalizeReceipt")(function* (
        requestId: string,
        patch: Partial<Pick<ReceiptBody, "payment_ref" | "settlement" | "refund_ref">>
      ) {
        const current = yield* readReceipt(requestId)
        if (current === undefined) return
        const body: ReceiptBody = { ...current.body, ...patch }
        const signature = yield* Effect.orDie(sign(body))
        yield* sql`
          UPDATE receipts SET body = ${JSON.stringify(body)}::jsonb, signature = ${signature}, final = true,
                 updated_at = now()
          WHERE request_id = ${requestId}
        `.pipe(Effect.orDie)
      })

      const economics = (requestId: string) =>
        sql<{ body: unknown }>`SELECT body FROM economics WHERE request_id = ${requestId}`.pipe(
          Effect.map((rows) => rows[0]?.body),
          Effect.orDie
        )

      return Ledger.of({
        reserveX402,
        nonceUnused,
        capture,
        release,
        finalizeReceipt,
        receipt: readReceipt,
        economics
      })
    })
  )
}
