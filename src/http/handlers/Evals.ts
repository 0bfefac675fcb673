import { Effect } from "effect"
import type { HttpServerRequest } from "effect/http/HttpServerRequest"
import { HttpApiBuilder } from "effect/http-api"
import { type EvalCredentials, Evals } from "../../evals/Evals.ts"
import { Api } from "../Api.ts"

const keysOf = (request: HttpServerRequest): EvalCredentials => ({
  apiKey: request.headers["x-api-key"],
  creditKey: request.headers["x-credit-key"]
})

export const EvalsHandlers = HttpApiBuilder.group(
  Api,
  "evals",
  Effect.fn(function* (handlers) {
    const evals = yield* Evals
    return handlers
      .handle("evalSuites", () =>
        Effect.succeed({
          object: "list" as const,
          data: evals.suites.map((suite) => ({
            id: suite.id,
            object: "eval.suite" as const,
            cases: suite.cases.map((c) => ({ id: c.id, dialect: c.dialect, exercises: c.exercises }))
          }))
        })
      )
      .handle("createEvalRun", ({ payload, request }) => evals.start(keysOf(request), payload))
      .handle("evalRun", ({ params, request }) => evals.run(params.id, keysOf(request)))
      .handle("optimizeContext", ({ payload, request }) => evals.optimize(keysOf(request), payload.task_ids))
  })
)
