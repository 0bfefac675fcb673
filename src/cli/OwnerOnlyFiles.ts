import { Effect, FileSystem, Path } from "effect"
import { SetupFailed } from "./Polling.ts"

/** The default home of the files: `$XDG_CONFIG_HOME/svc-setup`, else `~/.config/svc-setup`. */
export const defaultConfigDir = (env: Record<string, string | undefined>, home: string) =>
  `${env.XDG_CONFIG_HOME && env.XDG_CONFIG_HOME !== "" ? env.XDG_CONFIG_HOME : `${home}/.config`}/svc-setup`

/** The git work tree `dir` lies in, if any: a key must never land where a commit could carry it. */
const gitWorkTree = Effect.fn("gitWorkTree")(function* (dir: string) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  for (let current = path.resolve(dir); ; current = path.dirname(current)) {
    if (yield* fs.exists(path.join(current, ".git"))) return current
    if (path.dirname(current) === current) return undefined
  }
})

const failed = (message: string) => (error: { readonly message: string }) =>
  new SetupFailed({ message: `${message}: ${error.message}` })

/**
 * Writes `files` into `dir` readable by the owner alone: the directory 0700, each file 0600 from the moment
 * it exists (written to a fresh temporary name with that mode, then renamed over the target). Refuses a
 * directory inside a git work tree. Returns the paths written.
 */
export const writeOwnerOnly = Effect.fn("writeOwnerOnly")(function* (
  dir: string,
  files: ReadonlyArray<{ readonly name: string; readonly content: string }>
) {
  const fs = yield* FileSystem.FileSystem
  const path = yield* Path.Path
  const target = path.resolve(dir)
  const repository = yield* gitWorkTree(target).pipe(Effect.mapError(failed(`Cannot inspect ${target}`)))
  if (repository !== undefined) {
    return yield* new SetupFailed({
      message: `${target} is inside the git repository at ${repository}; choose a --config-dir outside any repository`
    })
  }
  yield* fs
    .makeDirectory(target, { recursive: true, mode: 0o700 })
    .pipe(Effect.mapError(failed(`Cannot create ${target}`)))
  yield* fs.chmod(target, 0o700).pipe(Effect.mapError(failed(`Cannot restrict ${target} to its owner`)))
  return yield* Effect.forEach(files, (file) =>
    Effect.gen(function* () {
      const destination = path.join(target, file.name)
      const temporary = `${destination}.${process.pid}.tmp`
      yield* fs.writeFileString(temporary, file.content, { flag: "wx", mode: 0o600 })
      yield* fs.chmod(temporary, 0o600)
      yield* fs.rename(temporary, destination)
      return destination
    }).pipe(Effect.mapError(failed(`Cannot write ${file.name} in ${target}`)))
  )
})
