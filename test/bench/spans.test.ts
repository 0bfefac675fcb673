import { describe, expect, it } from "vitest"
import { type OtlpSpan, phasesOf, spansOf } from "../../bench/load/Spans.ts"

const ns = (ms: number) => String(1_700_000_000_000_000_000n + BigInt(Math.round(ms * 1e6)))

/** An OTLP/HTTP JSON export of `spans`. */
const exportOf = (spans: ReadonlyArray<OtlpSpan>) => ({ resourceSpans: [{ scopeSpans: [{ spans }] }] })

/** One call's export: the server span, its admission, the reservation under it, the upstream call. */
const call = (trace: string, at: number, reserveMs: number) => {
  const span = (
    id: number,
    name: string,
    parent: number | undefined,
    from: number,
    to: number
  ): OtlpSpan => ({
    name,
    traceId: trace,
    spanId: `${trace}${id}`,
    parentSpanId: parent === undefined ? "" : `${trace}${parent}`,
    startTimeUnixNano: ns(at + from),
    endTimeUnixNano: ns(at + to)
  })
  return exportOf([
    span(1, "POST", undefined, 0, 3),
    span(2, "Completions.admit", 1, 0.4, 2.5),
    span(3, "postgres", 2, 0.8, 0.8 + reserveMs),
    span(4, "Serve.run", 2, 1.9, 9),
    span(5, "POST", 4, 2, 2.6)
  ])
}

describe("bench:phases reads where a call's time goes from its spans", () => {
  it("places each span by its median start and end from its call's server span, named with its parent", () => {
    const spans = [call("a", 0, 1), call("b", 10, 1.2), call("c", 20, 0.8)].flatMap(spansOf)
    // A background statement's trace (no server span, no admission) is not a call.
    const background = spansOf(
      exportOf([
        { name: "postgres", traceId: "z", spanId: "z1", startTimeUnixNano: ns(5), endTimeUnixNano: ns(6) }
      ])
    )
    const { calls, phases } = phasesOf([...spans, ...background])
    expect(calls).toBe(3)
    expect(phases.map((phase) => phase.name)).toEqual([
      "POST",
      "Completions.admit < POST",
      "postgres < Completions.admit",
      "Serve.run < Completions.admit",
      "POST < Serve.run"
    ])
    const reservation = phases.find((phase) => phase.name === "postgres < Completions.admit")!
    expect(reservation.calls).toBe(3)
    expect(reservation.startMs).toBeCloseTo(0.8, 6)
    expect(reservation.lengthMs).toBeCloseTo(1, 6)
    expect(reservation.endMs).toBeCloseTo(1.8, 6)
    expect(phases[0]!.endMs).toBeCloseTo(3, 6)
  })
})
