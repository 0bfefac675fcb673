import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { FeatureGated } from "../domain/Errors.ts"
import { openAi } from "./ErrorWire.ts"

const Gated = openAi(FeatureGated)
const anyBody = Schema.Unknown

/**
 * Launch-gated surfaces. They answer `feature_gated` before reading credentials or
 * payment, so no 402 is ever issued for them and no provider is called.
 */
export class GatedApi extends HttpApiGroup.make("gated").add(
  HttpApiEndpoint.post("embeddings", "/v1/embeddings", {
    payload: anyBody,
    success: Schema.Void,
    error: Gated
  }),
  HttpApiEndpoint.get("getPassport", "/v1/context/passports/:id", {
    params: { id: Schema.String },
    success: Schema.Void,
    error: Gated
  }),
  HttpApiEndpoint.delete("deletePassport", "/v1/context/passports/:id", {
    params: { id: Schema.String },
    success: Schema.Void,
    error: Gated
  }),
  // Patient orders (spec 3.3, 4.2): every order surface is off at launch, not a bare 404.
  HttpApiEndpoint.post("createOrder", "/v1/orders", { payload: anyBody, success: Schema.Void, error: Gated }),
  HttpApiEndpoint.get("getOrder", "/v1/orders/:id", {
    params: { id: Schema.String },
    success: Schema.Void,
    error: Gated
  }),
  HttpApiEndpoint.post("cancelOrder", "/v1/orders/:id/cancel", {
    payload: anyBody,
    success: Schema.Void,
    error: Gated
  })
) {}
