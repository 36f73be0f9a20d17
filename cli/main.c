/* main.c - the hyserve binary: one executable, several subcommands.
 *
 *   hyserve serve     HTTP server (server/serve.c)
 *   hyserve health    probe the local server's /ready (server/health.c)
 *   hyserve generate  stream a completion to stdout
 *   hyserve logits    print logits as JSON, for comparison with references
 *   hyserve info      architecture, layout, shapes, dtypes
 *   hyserve synth     write a seeded random model
 *   hyserve tensor    list tensors or print one dequantized
 *   hyserve mem       cache memory planner
 *   hyserve perplexity  perplexity and bits per byte over a text file
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_perplexity.h"
#include "engine.h"
#include "serve.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    { "serve", serve_main, "run the HTTP server (TGI and OpenAI compatible)" },
    { "health", serve_health, "exit 0 when the local server's /ready answers 200 (a HEALTHCHECK)" },
    { "generate", cli_generate, "generate text from a prompt, streamed to stdout" },
    { "logits", cli_logits, "print next-token logits as JSON" },
    { "info", cli_info, "describe a model file: architecture, layout, shapes, dtypes" },
    { "synth", cli_synth, "write a seeded random model of any size and layout" },
    { "tensor", cli_tensor, "list a file's tensors, or print one dequantized as JSON" },
    { "mem", cli_mem, "plan cache memory for any layout or preset, no weights needed" },
    { "perplexity", cli_perplexity, "perplexity and bits per byte of a text file (sliding window)" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: hyserve COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`hyserve COMMAND --help` explains each command's options.\n"
               "`-t N` sets the thread count everywhere; `hyserve --version` prints the build.\n");
}

int main(int argc, char **argv)
{
    engine_process_init(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("hyserve %s (git %s)\n", hyserve_version(), hyserve_git_commit());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    /* llama-server's habit: options and no command (`hyserve -m FILE
     * --port N`) mean serve; said once, so a typo'd command is not silent */
    if (argv[1][0] == '-' && argv[1][1]) {
        fprintf(stderr, "hyserve: no command given: running `hyserve serve` with these options\n");
        return serve_main(argc, argv);
    }
    fprintf(stderr, "hyserve: unknown command '%s' (try hyserve --help)\n", argv[1]);
    return 2;
}
