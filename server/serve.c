/* serve.c - placeholder until the HTTP server lands (issue 3). */
#include <stdio.h>

#include "serve.h"

int serve_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "hyserve: serve: the HTTP server is not built yet\n");
    return 2;
}
