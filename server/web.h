/* web.h - the dashboard's files, embedded in the binary.
 *
 * Owns: the table of embedded files (server/web/, turned into C arrays at
 * build time by tools/embed_web.py into build/gen/web_assets.c) and finding
 * one by its URL path. index.html is "/", the others "/web/NAME".
 * Does not own: serving them (routes.c adds the headers), what they show.
 */
#ifndef HYSERVE_WEB_H
#define HYSERVE_WEB_H

#include <stddef.h>

/* One embedded file. Static data, shared read-only by every thread. */
typedef struct web_asset {
    const char *path;                   /* URL path: "/" or "/web/app.js" */
    const char *content_type;           /* with charset for text */
    const unsigned char *data;          /* [len] bytes */
    size_t len;
} web_asset;

/* Terminated by an entry whose path is NULL (generated). */
extern const web_asset web_assets[];

/* The file served at path, or NULL. */
const web_asset *web_find(const char *path);

#endif
