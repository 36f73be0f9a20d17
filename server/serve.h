/* serve.h - the `hyserve serve` subcommand (HTTP server) and `hyserve
 * health`, its probe for a container's HEALTHCHECK. */
#ifndef HYSERVE_SERVE_H
#define HYSERVE_SERVE_H

/* Parses its own options (argv[0] is "serve"), runs until drained.
 * Returns the process exit code. */
int serve_main(int argc, char **argv);

/* GET /ready of the server this machine runs (address as serve_main finds
 * it). Returns 0 when it answered 200, else 1 (health.c). */
int serve_health(int argc, char **argv);

/* The build: "0.1.0" and the git commit baked in at build time (12 hex
 * digits, or "unknown" when built outside a git checkout). version.c. */
const char *hyserve_version(void);
const char *hyserve_git_commit(void);

#endif
