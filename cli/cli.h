/* cli.h - the engine subcommands of the hyserve binary and their shared
 * option helpers. Each returns the process exit code. */
#ifndef HYSERVE_CLI_H
#define HYSERVE_CLI_H

#include <stdbool.h>
#include <stdint.h>

int cli_generate(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_tensor(int argc, char **argv);
int cli_mem(int argc, char **argv);

/* Parse helpers: print one line naming the option and return false. */
bool cli_int(const char *opt, const char *val, long lo, long hi, long *out);
bool cli_float(const char *opt, const char *val, double *out);
/* "1.5G", "512M", "4096" -> bytes */
bool cli_bytes(const char *opt, const char *val, uint64_t *out);

#endif
