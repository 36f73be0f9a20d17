/* serve.h - the `hyserve serve` subcommand (HTTP server). */
#ifndef HYSERVE_SERVE_H
#define HYSERVE_SERVE_H

/* Parses its own options (argv[0] is "serve"), runs until drained.
 * Returns the process exit code. */
int serve_main(int argc, char **argv);

#endif
