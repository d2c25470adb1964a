#!/usr/bin/perl
# crates-copyright.pl TREE METADATA: the DEP-5 "Files:" paragraphs of the crates linked into
# the binaries. TREE is `cargo tree --prefix none -f '{p}'` output (one "NAME vVERSION [(SOURCE)]"
# per line; path crates, i.e. the workspace, are skipped: "Files: *" covers them), METADATA is
# `cargo metadata --format-version 1` (authors and license of each package).
# SPDX expressions become DEP-5 ones ("A OR B" -> "A or B", "(A OR B) AND C" -> "A or B, and C");
# anything else (WITH, a license file instead of an expression) stops the build with a message.
use strict;
use warnings;
use JSON::PP;

my ($tree, $metadata) = @ARGV;
die "usage: crates-copyright.pl TREE METADATA\n" unless defined $metadata;

open my $mf, '<', $metadata or die "crates-copyright.pl: cannot read $metadata: $!\n";
my $meta = JSON::PP->new->decode(do { local $/; <$mf> });
my %pkg;
for my $p (@{ $meta->{packages} }) {
    $pkg{"$p->{name} $p->{version}"} //= $p;
}

sub dep5_license {
    my ($name, $spdx) = @_;
    die "crates-copyright.pl: crate $name has no SPDX license expression (only a license file): add it to the copyright by hand\n"
        unless defined $spdx && length $spdx;
    my $e = $spdx;
    $e =~ s{\s*/\s*}{ OR }g;    # old Cargo syntax: "MIT/Apache-2.0"
    die "crates-copyright.pl: crate $name: cannot express \"$spdx\" in DEP-5\n" if $e =~ /\bWITH\b/;
    # A conjunction of terms, each a license or a parenthesised disjunction.
    my @terms;
    while (length $e) {
        $e =~ s/^\s+//;
        if ($e =~ s/^\(([^()]*)\)//) {
            my $inner = $1;
            die "crates-copyright.pl: crate $name: cannot express \"$spdx\" in DEP-5\n" if $inner =~ /\bAND\b/;
            push @terms, join(' or ', split /\s+OR\s+/, $inner);
        } elsif ($e =~ s/^([^()]+?)(?=\s+AND\s+|\s*$)//) {
            my $t = $1;
            push @terms, join(' or ', split /\s+OR\s+/, $t);
        } else {
            die "crates-copyright.pl: crate $name: cannot express \"$spdx\" in DEP-5\n";
        }
        $e =~ s/^\s+AND\s+// or last;
    }
    die "crates-copyright.pl: crate $name: cannot express \"$spdx\" in DEP-5\n" if $e =~ /\S/;
    # "A or B, and C": a comma separates the conjunction when a term is a disjunction.
    return join((grep { / or / } @terms) ? ', and ' : ' and ', @terms) if @terms > 1;
    return $terms[0];
}

open my $tf, '<', $tree or die "crates-copyright.pl: cannot read $tree: $!\n";
my %seen;
my @out;
while (my $line = <$tf>) {
    chomp $line;
    $line =~ s/\s*\(\*\)\s*$//;
    next unless $line =~ /^(\S+) v(\S+)(.*)$/;
    my ($name, $version, $rest) = ($1, $2, $3);
    next if $rest =~ /\(\//;            # a path crate: the workspace
    next if $seen{"$name $version"}++;
    my $p = $pkg{"$name $version"}
        or die "crates-copyright.pl: $name $version is not in cargo metadata\n";
    my @authors = map { s/\s+/ /gr } @{ $p->{authors} || [] };
    @authors = ("the $name authors") unless @authors;
    push @out, [ $name, $version, \@authors, dep5_license($name, $p->{license}), $p->{repository} ];
}
for my $c (sort { $a->[0] cmp $b->[0] || $a->[1] cmp $b->[1] } @out) {
    my ($name, $version, $authors, $license, $repo) = @$c;
    print "Files: vendor/$name-$version/*\n";
    print "Copyright: ", join("\n ", @$authors), "\n";
    print "License: $license\n";
    print "Comment: $repo\n" if defined $repo && length $repo;
    print "\n";
}
