/*
 * LD_PRELOAD shim for tests/peers/up debuginfod: Debian's debuginfod (0.188)
 * has no listen-address option and binds the wildcard address; every peer of
 * proflow's tests must listen on loopback only. This wraps bind(2) so that a
 * wildcard address becomes a loopback one: IPv4 0.0.0.0 becomes 127.0.0.1; an
 * IPv6 wildcard becomes ::ffff:127.0.0.1 on a dual-stack socket (libmicrohttpd
 * serves IPv4 through one, so 127.0.0.1 keeps working) and ::1 on an IPv6-only
 * socket. Any other address is passed through unchanged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind)
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");

    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, addr, sizeof v4);
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&v4, sizeof v4);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        memcpy(&v6, addr, sizeof v6);
        if (memcmp(&v6.sin6_addr, &in6addr_any, sizeof in6addr_any) == 0) {
            int v6only = 0;
            socklen_t optlen = sizeof v6only;
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &optlen) == 0 && v6only) {
                v6.sin6_addr = in6addr_loopback;
            } else {
                static const unsigned char mapped_loopback[16] = {
                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
                memcpy(&v6.sin6_addr, mapped_loopback, sizeof mapped_loopback);
            }
            return real_bind(fd, (const struct sockaddr *)&v6, sizeof v6);
        }
    }
    return real_bind(fd, addr, len);
}
