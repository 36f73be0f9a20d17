/* cli_perplexity.h - `hyserve perplexity`: perplexity and bits per byte of a
 * model over a text file, with a sliding window (llama-perplexity style).
 * Returns the process exit code. */
#ifndef HYSERVE_CLI_PERPLEXITY_H
#define HYSERVE_CLI_PERPLEXITY_H

int cli_perplexity(int argc, char **argv);

#endif
