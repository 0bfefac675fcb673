import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { Forbidden, InvalidRequest, NotFound, Unauthorized } from "../domain/Errors.ts"
import {
  ContextRecommendation,
  CreateEvalRun,
  EvalRun,
  EvalSuiteList,
  OptimizeRequest
} from "../domain/Evals.ts"
import { openAi } from "./ErrorWire.ts"

const KeyErrors = [openAi(InvalidRequest), openAi(Unauthorized), openAi(Forbidden), openAi(NotFound)] as const

/** Evaluations (spec 4.3; D146–D149): the public suite list, key-owned runs and context tuning. */
export class EvalsApi extends HttpApiGroup.make("evals").add(
  HttpApiEndpoint.get("evalSuites", "/v1/evals/suites", { success: EvalSuiteList }),
  HttpApiEndpoint.post("createEvalRun", "/v1/evals/runs", {
    payload: CreateEvalRun,
    success: EvalRun,
    error: KeyErrors
  }),
  HttpApiEndpoint.get("evalRun", "/v1/evals/runs/:id", {
    params: { id: Schema.String },
    success: EvalRun,
    error: KeyErrors
  }),
  HttpApiEndpoint.post("optimizeContext", "/v1/evals/context/optimize", {
    payload: OptimizeRequest,
    success: ContextRecommendation,
    error: KeyErrors
  })
) {}
