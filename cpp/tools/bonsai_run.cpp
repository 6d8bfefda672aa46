// PLACEHOLDER (being written)
#include <cstdio>
int main() { std::puts("bonsai_run"); return 0; }
