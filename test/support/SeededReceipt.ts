/**
 * The stored body of an x402 request's receipt while its settlement is pending, for tests and benches that
 * seed captured authorizations straight into the ledger (no request served).
 */
export const pendingReceiptBody = (requestId: string, payer: string, value: number) => ({
  request_id: requestId,
  wallet: payer,
  provider_id: "p",
  model_class: "chat-small",
  in_tokens: 1,
  out_tokens: 1,
  cached_tokens: 0,
  price_in: 1,
  price_out: 1,
  price_in_cached: null,
  charged: value,
  authorized: value,
  payment_ref: "pending",
  refund_ref: null,
  ttft_ms: 1,
  status: "ok",
  settlement: "pending",
  epoch_id: 1,
  session_id: null,
  quotes_competing: 1,
  created_at: 0
})
