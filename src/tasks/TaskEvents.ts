import { PgClient } from "@effect/sql-pg"
import { Context, Effect, Layer, PubSub, Queue, Schedule, type Scope } from "effect"

/** The Postgres channel a task event's commit is announced on (payload: the task id). */
export const TASK_EVENTS_CHANNEL = "task_events"

/**
 * Wakes the readers of a task's event log on every router instance: each instance LISTENs once on
 * `task_events` (the appending transaction NOTIFYs, so the wake-up comes after the commit) and fans the
 * task ids out to its waiting readers. A reader also re-reads on a short tick, so a lost connection
 * delays a wake-up, never loses an event: the log itself is the truth, the channel only a hint.
 */
export class TaskEvents extends Context.Service<
  TaskEvents,
  {
    /**
     * Starts listening for `taskId` (before the reader looks at the log, so no commit falls between);
     * the returned wait ends when the task may have a new event, or after `maxMs` (at most 1 s).
     */
    readonly watch: (
      taskId: string
    ) => Effect.Effect<(maxMs: number) => Effect.Effect<void>, never, Scope.Scope>
  }
>()("router/tasks/TaskEvents") {
  static readonly layer = Layer.effect(
    TaskEvents,
    Effect.gen(function* () {
      const pg = yield* PgClient.PgClient
      const hub = yield* PubSub.unbounded<string>()
      const listen = Effect.gen(function* () {
        const notifications = yield* pg.listen(TASK_EVENTS_CHANNEL)
        while (true) {
          const notification = yield* Queue.take(notifications)
          yield* PubSub.publish(hub, notification.payload)
        }
      }).pipe(Effect.scoped)
      yield* listen.pipe(
        Effect.catchCause((cause) => Effect.logWarning("task event listener lost; reconnecting", cause)),
        Effect.repeat(Schedule.spaced("1 second")),
        Effect.forkScoped
      )

      const watch = (taskId: string) =>
        Effect.map(PubSub.subscribe(hub), (subscription) => {
          const woken = Effect.gen(function* () {
            while ((yield* PubSub.take(subscription)) !== taskId) {}
          })
          return (maxMs: number) =>
            woken.pipe(Effect.timeoutOption(`${Math.max(0, Math.min(maxMs, 1_000))} millis`), Effect.asVoid)
        })

      return TaskEvents.of({ watch })
    })
  )
}
