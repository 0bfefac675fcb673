import { Effect, Exit, Schema } from "effect"
import type { SqlClient } from "effect/sql"
import { passWhenWoken, repeatInBackground } from "../Background.ts"
import type { ChainShape } from "../chain/Chain.ts"
import { ReceiptBody } from "../domain/Receipt.ts"
import { traced } from "../Telemetry.ts"
import { signReceipt, signReceipts } from "./ReceiptSigner.ts"

const decodeReceipt = Schema.decodeUnknownEffect(ReceiptBody)

export type ReceiptStore = Effect.Success<ReturnType<typeof makeReceiptStore>>

/** How long a queued receipt waits for others to be signed with it (a pass: all queued so far, one statement). */
const SIGN_EVERY = "20 millis"
/** A receipt left unsigned this long was queued by an instance that stopped first: the sweep signs it. */
const SWEEP_AFTER_SECONDS = 5
const SWEEP_BATCH = 500

/** A receipt the router signs as it is stored: its settlement is known (drawn from a balance, or released). */
const finalAsStored = (receipt: ReceiptBody) =>
  receipt.settlement === "landed" || receipt.settlement === "none"

/**
 * Where receipts are signed and kept: the router signer's EIP-712 signature, the stored body with its
 * economics, and the re-signing of a receipt once its settlement facts are final.
 *
 * A receipt final as it is settled (drawn from a balance or a budget, or released) is signed before it is
 * stored (`signFinal`), so its row is written once, signed (D495): a signature stored by a later update
 * was a second, non-HOT write of the row, a statement and a commit of its own, and an entry in the
 * sweep's index. One that could not be signed then is stored unsigned and queued (`enqueue`): a
 * background pass 20 ms after the first receipt queued signs what is queued by then (`signReceipts`) and
 * stores the signatures in one statement (spec 2.3: the receipt linked from the reply can finalize shortly
 * after the response); with nothing queued the pass does not run (D572).
 * Signatures are deterministic (RFC 6979), so whoever signs a receipt first (the pass, a reader that
 * finds it unsigned, the sweep of an instance that stopped before signing) stores the same bytes.
 */
export const makeReceiptStore = Effect.fnUntraced(function* (sql: SqlClient.SqlClient, chain: ChainShape) {
  const sign = (receipt: ReceiptBody) => signReceipt(chain, receipt)

  const storeSignatures = (
    signed: ReadonlyArray<{ readonly request_id: string; readonly signature: string }>
  ) =>
    signed.length === 0
      ? Effect.void
      : sql`
          UPDATE receipts r SET signature = v.signature, final = true, updated_at = now()
          FROM jsonb_to_recordset(${JSON.stringify(signed)}::jsonb) AS v(request_id text, signature text)
          WHERE r.request_id = v.request_id AND r.signature IS NULL
        `.pipe(Effect.asVoid)

  const signAll = (batch: ReadonlyArray<ReceiptBody>) =>
    signReceipts(chain, batch).pipe(
      Effect.flatMap((signatures) =>
        storeSignatures(
          batch.map((receipt, i) => ({ request_id: receipt.request_id, signature: signatures[i]! }))
        )
      )
    )

  const queue: Array<ReceiptBody> = []

  /**
   * Signs every receipt queued so far. A failed pass leaves its receipts to the sweep. A batch taken
   * from the queue is signed and stored whole (uninterruptible): closing the layer waits for it.
   */
  const signQueued = Effect.gen(function* () {
    while (queue.length > 0)
      yield* Effect.uninterruptible(Effect.suspend(() => signAll(queue.splice(0, SWEEP_BATCH))))
  })

  /** Receipts stored final but never signed (their instance stopped first), oldest first. */
  const sweep = Effect.gen(function* () {
    const rows = yield* sql<{ body: unknown }>`
      SELECT body FROM receipts
      WHERE signature IS NULL AND body->>'settlement' IN ('landed', 'none')
        AND created_at < now() - make_interval(secs => ${SWEEP_AFTER_SECONDS})
      ORDER BY created_at LIMIT ${SWEEP_BATCH}
    `
    yield* signAll(yield* Effect.forEach(rows, (row) => decodeReceipt(row.body)))
  })

  const wake = yield* passWhenWoken(signQueued, {
    every: SIGN_EVERY,
    pending: () => queue.length > 0,
    failure: "signing receipts failed"
  })
  yield* repeatInBackground(sweep, { every: "30 seconds", failure: "signing unsigned receipts failed" })
  // What is queued at shutdown is signed before the database goes (else the sweep of a later run does).
  yield* Effect.addFinalizer(() => Effect.ignore(signQueued))

  /**
   * The router signer's signature of a receipt about to be stored final, or null when it could not be
   * made (the receipt is then stored unsigned and queued). Never fails: signing never costs a settlement.
   */
  const signFinal = (receipt: ReceiptBody): Effect.Effect<string | null> =>
    Effect.exit(Effect.suspend(() => sign(receipt))).pipe(
      Effect.flatMap((exit) =>
        Exit.isSuccess(exit)
          ? Effect.succeed(exit.value)
          : Effect.as(
              Effect.logWarning("signing a receipt before it is stored failed; it is signed after", {
                request_id: receipt.request_id,
                cause: String(exit.cause)
              }),
              null
            )
      )
    )

  /** Queues a stored receipt for signing (settled: drawn from a balance or budget, or released). */
  const enqueue = (receipt: ReceiptBody) =>
    Effect.sync(() => {
      queue.push(receipt)
      wake()
    })

  /** A stored receipt; one whose settlement is known and that is not signed yet is signed now. */
  const readReceipt = (requestId: string) =>
    sql<{ body: unknown; signature: string | null; final: boolean }>`
      SELECT body, signature, final FROM receipts WHERE request_id = ${requestId}
    `.pipe(
      Effect.flatMap((rows) =>
        Effect.gen(function* () {
          const row = rows[0]
          if (row === undefined) return undefined
          const body = yield* decodeReceipt(row.body)
          if (row.signature !== null || !finalAsStored(body)) {
            return { body, signature: row.signature, final: row.final }
          }
          const signature = yield* sign(body)
          yield* storeSignatures([{ request_id: requestId, signature }])
          return { body, signature, final: true }
        })
      ),
      Effect.orDie
    )

  const finalizeReceipt = Effect.fnUntraced(function* (
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
  }, traced("Ledger.finalizeReceipt"))

  const economics = (requestId: string) =>
    sql<{ body: unknown }>`SELECT body FROM economics WHERE request_id = ${requestId}`.pipe(
      Effect.map((rows) => rows[0]?.body),
      Effect.orDie
    )

  return {
    enqueue,
    signFinal,
    read: readReceipt,
    finalize: finalizeReceipt,
    economics
  }
})
