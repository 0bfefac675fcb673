import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type Evidence, grade, routerOnly } from "../../src/tasks/Acceptance.ts"
import { unsupported, violations } from "../../src/tasks/JsonSchema.ts"
import { traceOf } from "../../src/tasks/Trace.ts"

/** The narrowest schema of the subset that a value satisfies: its types, keys and items, all required. */
const schemaOf = (value: unknown): unknown => {
  if (value === null) return { type: "null" }
  if (Array.isArray(value)) return { type: "array", items: value.length === 0 ? true : { enum: value } }
  if (typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
    return {
      type: "object",
      properties: Object.fromEntries(entries.map(([k, v]) => [k, schemaOf(v)])),
      required: entries.map(([k]) => k),
      additionalProperties: false
    }
  }
  if (typeof value === "number") return { type: Number.isInteger(value) ? "integer" : "number", const: value }
  return { type: typeof value, const: value }
}

const json = fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown)

const evidence = (overrides: Partial<Evidence> = {}): Evidence => ({
  events: [],
  unresolvedEffects: [],
  budget: 100,
  spent: 0,
  held: 0,
  steps: 0,
  maxSteps: 10,
  approvals: new Map(),
  artifacts: new Set(),
  output: undefined,
  ...overrides
})

describe("acceptance grading (pure)", () => {
  it("every JSON value satisfies the schema built from it, and the schema is inside the subset", () =>
    fc.assert(
      fc.property(json, (value) => {
        const schema = schemaOf(value)
        assert.deepStrictEqual(unsupported(schema), [])
        assert.deepStrictEqual(violations(schema, value), [])
      })
    ))

  it("keys named like Object.prototype's members are plain keys (CI found valueOf)", () => {
    const value = [{ valueOf: false, toString: "x", constructor: 1 }]
    assert.deepStrictEqual(violations(schemaOf(value), value), [])
    assert.deepStrictEqual(violations({ type: "object", required: ["toString"] }, {}), [
      '$: missing "toString"'
    ])
    assert.deepStrictEqual(violations({ const: { a: 1 } }, { valueOf: 1 }), ["$: must equal the constant"])
    assert.deepStrictEqual(
      violations({ type: "object", additionalProperties: false }, { hasOwnProperty: 1 }),
      ['$: "hasOwnProperty" is not allowed']
    )
  })

  it("a value of another JSON type never satisfies a typed schema", () =>
    fc.assert(
      fc.property(json, json, (a, b) => {
        const typeOf = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v)
        fc.pre(typeOf(a) !== typeOf(b))
        assert.isAbove(violations(schemaOf(a), b).length, 0)
      })
    ))

  it("schemas with keywords outside the subset are refused, never silently ignored", () => {
    assert.isAbove(unsupported({ type: "string", pattern: "^a" }).length, 0)
    assert.isAbove(unsupported({ type: "object", properties: { x: { oneOf: [] } } }).length, 0)
    assert.isAbove(unsupported({ additionalProperties: { type: "string" } }).length, 0)
  })

  it("a client event with a router-only name never satisfies a required event; any other name does", () =>
    fc.assert(
      fc.property(
        fc.constantFrom("verification.passed", "checkpoint.saved", "task.claimed", "effect.completed"),
        fc.string({ minLength: 1, maxLength: 20 }).filter((s) => !routerOnly(s)),
        (routerType, clientType) => {
          const contract = { required_events: [routerType, clientType] }
          const fromClient = grade(
            contract,
            evidence({
              events: [
                { type: routerType, source: "client" },
                { type: clientType, source: "client" }
              ]
            })
          )
          assert.isFalse(fromClient[0]!.passed)
          assert.include(fromClient[0]!.detail, routerType)
          assert.strictEqual(fromClient[0]!.detail, `missing: ${routerType}`)
          const fromRouter = grade(
            contract,
            evidence({
              events: [
                { type: routerType, source: "router" },
                { type: clientType, source: "client" }
              ]
            })
          )
          assert.isTrue(fromRouter[0]!.passed)
        }
      )
    ))

  it("more evidence never fails a check that passed (events, approvals, artifacts)", () =>
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom("a", "b", "c", "d"), { maxLength: 4 }),
        fc.array(fc.constantFrom("a", "b", "c", "d"), { maxLength: 6 }),
        fc.array(fc.constantFrom("a", "b", "c", "d"), { maxLength: 3 }),
        (required, present, extra) => {
          const contract = {
            required_events: required,
            required_approvals: required,
            required_artifacts: required
          }
          const at = (names: ReadonlyArray<string>) =>
            grade(
              contract,
              evidence({
                events: names.map((type) => ({ type, source: "client" as const })),
                approvals: new Map(names.map((n) => [n, "granted" as const])),
                artifacts: new Set(names)
              })
            )
          const before = at(present)
          const after = at([...present, ...extra])
          before.forEach((check, i) => {
            if (check.passed) assert.isTrue(after[i]!.passed, check.name)
          })
        }
      )
    ))

  it("without a contract a task owes resolved effects and a kept budget", () => {
    const checks = grade(null, evidence({ unresolvedEffects: ["e1"] }))
    assert.deepStrictEqual(
      checks.map((c) => [c.name, c.passed]),
      [
        ["effects_resolved", false],
        ["budget_not_exceeded", true]
      ]
    )
  })
})

describe("OTLP trace (pure)", () => {
  it("one trace: every span under the task's root, unique ids, no span ends before it starts", () =>
    fc.assert(
      fc.property(
        fc.array(fc.record({ start: fc.nat(10_000), length: fc.option(fc.nat(5_000)) }), { maxLength: 8 }),
        fc.array(fc.constantFrom("task.claimed", "checkpoint.saved", "note", "verification.failed"), {
          maxLength: 8
        }),
        (calls, events) => {
          const trace = traceOf({
            taskId: "task_x",
            createdAt: 0,
            now: 20_000,
            state: "running",
            budget: 100,
            spent: 10,
            calls: calls.map((c, i) => ({
              requestId: `req_${i}`,
              startedAt: c.start,
              settledAt: c.length === null ? null : c.start + c.length,
              held: 5,
              charged: c.length === null ? null : 1,
              providerId: "p",
              modelClass: "m",
              status: "ok",
              inTokens: 1,
              outTokens: 1
            })),
            events: events.map((type, i) => ({ seq: i + 1, type, source: "router", createdAt: i })),
            effects: []
          })
          const spans = trace.resourceSpans[0]!.scopeSpans[0]!.spans
          const root = spans[0]!
          assert.strictEqual(new Set(spans.map((s) => s.spanId)).size, spans.length)
          for (const span of spans) {
            assert.strictEqual(span.traceId, root.traceId)
            assert.match(span.traceId, /^[0-9a-f]{32}$/)
            assert.match(span.spanId, /^[0-9a-f]{16}$/)
            assert.isTrue(BigInt(span.endTimeUnixNano) >= BigInt(span.startTimeUnixNano))
            if (span !== root) assert.strictEqual(span.parentSpanId, root.spanId)
          }
          // Client-named events are not router spans.
          assert.strictEqual(spans.filter((s) => s.name === "note").length, 0)
        }
      )
    ))
})
