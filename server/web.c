/* web.c - lookup in the embedded dashboard files (see web.h). */
#include <string.h>

#include "web.h"

const web_asset *web_find(const char *path)
{
    for (const web_asset *a = web_assets; a->path; a++)
        if (!strcmp(a->path, path))
            return a;
    return NULL;
}
