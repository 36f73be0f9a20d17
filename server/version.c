/* version.c - the build's identity: version and git commit.
 *
 * Owns: the two strings `hyserve --version`, GET /info and the
 * hyserve_build_info metric report. The Makefile passes the commit as
 * -DHYSERVE_GIT_COMMIT to this file alone and recompiles it when
 * `git rev-parse HEAD` (or GIT_COMMIT=...) changes.
 */
#include "serve.h"

#ifndef HYSERVE_GIT_COMMIT
#define HYSERVE_GIT_COMMIT "unknown"
#endif

#define HYSERVE_VERSION "0.1.0"

const char *hyserve_version(void)
{
    return HYSERVE_VERSION;
}

const char *hyserve_git_commit(void)
{
    return HYSERVE_GIT_COMMIT;
}
