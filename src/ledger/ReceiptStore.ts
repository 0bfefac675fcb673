import { Effect, Schema } from "effect"
import type { SqlClient } from "effect/sql"
import type { ChainShape } from "../chain/Chain.ts"
import { ReceiptBody, receiptTypedData } from "../domain/Receipt.ts"

const decodeReceipt = Schema.decodeUnknownEffect(ReceiptBody)

export type ReceiptStore = ReturnType<typeof makeReceiptStore>

/**
 * Where receipts are signed and kept: the router signer's EIP-712 signature, the stored body with its
 * economics, and the re-signing of a receipt once its settlement facts are final.
 */
export const makeReceiptStore = (sql: SqlClient.SqlClient, chain: ChainShape) => {
  const sign = (receipt: ReceiptBody) => chain.signTypedData(receiptTypedData(receipt, chain.chainId))

  const storeReceipt = (receipt: ReceiptBody, economics: unknown) =>
    Effect.all([
      sql`INSERT INTO receipts (request_id, epoch_id, body) VALUES (${receipt.request_id}, ${receipt.epoch_id},
            ${JSON.stringify(receipt)}::jsonb)`,
      sql`INSERT INTO economics (request_id, body) VALUES (${receipt.request_id}, ${JSON.stringify(economics)}::jsonb)`
    ])

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

  return { sign, store: storeReceipt, read: readReceipt, finalize: finalizeReceipt, economics }
}
