/**
 * Runs a bench script's `main` and exits with its code (0 when it returns nothing), or prints the error and
 * exits with `failed` (the scripts start child processes and timers that would otherwise keep Node alive).
 */
export const runMain = (main: () => Promise<unknown>, failed = 1) =>
  main().then(
    (code) => process.exit(typeof code === "number" ? code : 0),
    (error: unknown) => {
      process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`)
      process.exit(failed)
    }
  )
