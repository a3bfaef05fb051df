#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: collatz N\n");
        return 2;
    }
    unsigned long n = strtoul(argv[1], NULL, 10);
    int steps = 0;
    while (n > 1) {
        n = (n % 2) ? 3 * n + 1 : n / 2;
        steps++;
    }
    printf("%d\n", steps);
    return 0;
}
